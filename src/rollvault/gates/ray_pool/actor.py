"""The generation actor: a Ray actor hosting the local model gate's generation engine.

It holds one :class:`~rollvault.gates.generation_worker.GenerationEngine`,
the very engine the local model gate's worker process runs, and speaks the
same messages (:mod:`rollvault.gates.worker_protocol`) as msgpack bytes, so
a batch generated here is the batch a worker process would have generated.
Weights arrive as the object reference of one broadcast version: Ray
resolves it to the safetensors bytes in the object store before the call.

A model that cannot be loaded is not a crash of the actor (Ray would restart
it for nothing): :meth:`GenerationActor.ready` reports it as
:class:`~rollvault.gates.worker_protocol.WorkerFailed`.
"""

from __future__ import annotations

import os

import torch

from rollvault.gates.generation_worker import GenerationEngine
from rollvault.gates.worker_protocol import (
    Generate,
    LoadWeights,
    WorkerFailed,
    WorkerReply,
    decode_command,
    decode_settings,
    encode,
)

__all__ = ["GenerationActor"]


class GenerationActor:
    """The body of one generation actor (wrapped with ``ray.remote`` by the pool)."""

    def __init__(self, settings_bytes: bytes) -> None:
        settings = decode_settings(settings_bytes)
        torch.set_num_threads(settings.torch_threads)
        self._engine: GenerationEngine | None = None
        self._failure: str | None = None
        try:
            self._engine = GenerationEngine(settings)
        except Exception as exc:  # noqa: BLE001 - reported by ready(), which the pool raises
            self._failure = f"cannot load model: {exc!r}"

    def pid(self) -> int:
        """The actor's process id (what a fault test kills)."""
        return os.getpid()

    def ready(self) -> bytes:
        """``Ready`` once the model is loaded, or ``WorkerFailed`` saying why it cannot be."""
        if self._engine is None:
            return encode(WorkerFailed(message=self._failure or "no engine"))
        return encode(self._engine.ready())

    def load_weights(self, version: int, weights: bytes) -> bytes:
        """Load weight ``version`` (``weights``: the broadcast reference, resolved by Ray)."""
        return encode(self._run(LoadWeights(version=version, weights=weights)))

    def generate(self, command: bytes) -> bytes:
        """Run one encoded :class:`~rollvault.gates.worker_protocol.Generate` command."""
        decoded = decode_command(command)
        if not isinstance(decoded, Generate):
            return encode(WorkerFailed(message=f"expected generate, got {type(decoded).__name__}"))
        return encode(self._run(decoded))

    def _run(self, command: LoadWeights | Generate) -> WorkerReply:
        if self._engine is None:
            return WorkerFailed(message=self._failure or "no engine")
        return self._engine.execute(command)
