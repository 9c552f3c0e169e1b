"""Messages between the local model gate and its generation worker process.

Transport as for every child process (:mod:`rollvault.gates.child_pipe`):
msgpack bytes over a pipe, nothing unpickled, strict decoding, so a
malformed message is an error naming the offending field, never a silently
wrong batch. Weights travel as safetensors bytes inside :class:`LoadWeights`.
"""

from __future__ import annotations

from typing import Final

from rollvault.config.schema import ModelDType
from rollvault.gates.child_pipe import PipeCodec
from rollvault.gates.child_pipe import PipeMessage as _Message

__all__ = [
    "CODEC",
    "Generate",
    "Generated",
    "GenerationRequest",
    "GenerationResult",
    "LoadWeights",
    "Ready",
    "Shutdown",
    "WeightsLoaded",
    "WorkerCommand",
    "WorkerFailed",
    "WorkerReply",
    "WorkerSettings",
    "decode_command",
    "decode_reply",
    "decode_settings",
    "encode",
]


class WorkerSettings(_Message, frozen=True):
    """What a worker needs to start: the model directory, its dtype, and how to sample."""

    model_path: str
    temperature: float
    stop_token_ids: list[int]
    """A row stops at the first of these (eos, generation config eos ids, end of turn)."""
    pad_token_id: int
    top_p: float = 1.0
    top_k: int = 0
    dtype: ModelDType = ModelDType.FLOAT32
    torch_threads: int = 1


class GenerationRequest(_Message, frozen=True):
    """One prompt to complete."""

    request_id: int
    prompt_ids: list[int]
    seed: int
    max_new_tokens: int | None = None
    """At most this many tokens for this request (a chunk of a turn); None: the batch's."""


class Generate(_Message, frozen=True, tag="generate"):
    """Generate one batch (left-padded together) with the worker's current weights."""

    requests: list[GenerationRequest]
    max_new_tokens: int


class LoadWeights(_Message, frozen=True, tag="load_weights"):
    """Replace the model's weights (safetensors bytes of a full state dict)."""

    version: int
    weights: bytes


class Shutdown(_Message, frozen=True, tag="shutdown"):
    """Exit the worker loop."""


WorkerCommand = Generate | LoadWeights | Shutdown


class Ready(_Message, frozen=True, tag="ready"):
    """The model is loaded; the worker takes commands."""

    pid: int
    dtype: str
    """The loaded model's parameter dtype (``torch.float32`` ...), as the worker sees it."""


class GenerationResult(_Message, frozen=True):
    """One request's response tokens and their sampling logprobs."""

    request_id: int
    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    """The response ended with a stop token, its last (False: cut at ``max_new_tokens``)."""


class Generated(_Message, frozen=True, tag="generated"):
    """A batch's results and the weight version that generated them (None: initial weights)."""

    weight_version: int | None
    results: list[GenerationResult]


class WeightsLoaded(_Message, frozen=True, tag="weights_loaded"):
    version: int


class WorkerFailed(_Message, frozen=True, tag="failed"):
    """A command failed inside the worker; ``message`` says why."""

    message: str


WorkerReply = Ready | Generated | WeightsLoaded | WorkerFailed

CODEC: Final[PipeCodec[WorkerCommand, WorkerReply, WorkerSettings]] = PipeCodec(
    WorkerCommand, WorkerReply, WorkerSettings
)
encode: Final = CODEC.encode
decode_command: Final = CODEC.decode_command
decode_reply: Final = CODEC.decode_reply
decode_settings: Final = CODEC.decode_settings
