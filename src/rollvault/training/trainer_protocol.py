"""Messages between the controller and its trainer process (``trainer.placement: process``).

Transport as for every child process (:mod:`rollvault.gates.child_pipe`):
msgpack bytes over a ``multiprocessing`` pipe, nothing unpickled. Weights
travel as safetensors bytes, a step's samples as raw array bytes
(:class:`~rollvault.training.grpo_trainer.StepSamples`), checkpoint
directories as paths the controller created.
"""

from __future__ import annotations

import enum
from typing import Final

from rollvault.config.schema import ModelDType
from rollvault.gates.child_pipe import PipeCodec
from rollvault.gates.child_pipe import PipeMessage as _Message
from rollvault.training.grpo_trainer import GrpoSettings, StepSamples

__all__ = [
    "CODEC",
    "CheckpointDone",
    "FailureKind",
    "GetWeights",
    "LoadCheckpoint",
    "SaveCheckpoint",
    "SetWeights",
    "StepDone",
    "Stop",
    "TrainStep",
    "TrainerCommand",
    "TrainerFailed",
    "TrainerReady",
    "TrainerReply",
    "TrainerSettings",
    "Weights",
    "decode_command",
    "decode_reply",
    "decode_settings",
    "encode",
]


class TrainerSettings(_Message, frozen=True):
    """What the trainer process needs to start: the model directory and the GRPO settings."""

    model_path: str
    dtype: ModelDType
    pad_token_id: int
    settings: GrpoSettings
    torch_threads: int = 1


# -- commands -----------------------------------------------------------------------------------


class SetWeights(_Message, frozen=True, tag="set_weights"):
    """Replace the policy's weights (the version-0 policy the controller warmed up or loaded)."""

    weights: bytes


class TrainStep(_Message, frozen=True, tag="train_step"):
    samples: StepSamples


class GetWeights(_Message, frozen=True, tag="get_weights"):
    pass


class SaveCheckpoint(_Message, frozen=True, tag="save_checkpoint"):
    directory: str
    """An empty directory the controller created; it publishes it after the reply."""


class LoadCheckpoint(_Message, frozen=True, tag="load_checkpoint"):
    directory: str


class Stop(_Message, frozen=True, tag="stop"):
    pass


TrainerCommand = SetWeights | TrainStep | GetWeights | SaveCheckpoint | LoadCheckpoint | Stop

# -- replies ------------------------------------------------------------------------------------


class TrainerReady(_Message, frozen=True, tag="ready"):
    pid: int


class StepDone(_Message, frozen=True, tag="step_done"):
    metrics: dict[str, float]


class Weights(_Message, frozen=True, tag="weights"):
    weights: bytes


class CheckpointDone(_Message, frozen=True, tag="done"):
    """A command without a result (set weights, save or load a checkpoint) finished."""


class FailureKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    """A checkpoint is missing, damaged or does not fit (TrainerCheckpointError)."""
    BATCH = "batch"
    """A step's samples are not trainable as sent (TrainBatchError)."""
    OTHER = "other"


class TrainerFailed(_Message, frozen=True, tag="failed"):
    kind: FailureKind
    message: str


TrainerReply = TrainerReady | StepDone | Weights | CheckpointDone | TrainerFailed

CODEC: Final[PipeCodec[TrainerCommand, TrainerReply, TrainerSettings]] = PipeCodec(
    TrainerCommand, TrainerReply, TrainerSettings
)
encode: Final = CODEC.encode
decode_command: Final = CODEC.decode_command
decode_reply: Final = CODEC.decode_reply
decode_settings: Final = CODEC.decode_settings
