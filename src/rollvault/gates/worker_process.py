"""The parent's handle on one generation worker process.

Blocking calls (send a command, wait for its reply); the gate runs them in a
thread. A worker that dies (killed, crashed, out of memory) shows up as
:class:`WorkerLostError` on the next call, or on the call in progress: the
parent closed its copy of the child's pipe end, so the pipe reports EOF as
soon as the worker is gone.
"""

from __future__ import annotations

import msgspec

from rollvault.gates.child_pipe import spawn_child, stop_child
from rollvault.gates.generation_worker import worker_main
from rollvault.gates.worker_protocol import (
    Generate,
    Generated,
    LoadWeights,
    Ready,
    Shutdown,
    WeightsLoaded,
    WorkerCommand,
    WorkerFailed,
    WorkerReply,
    WorkerSettings,
    decode_reply,
    encode,
)

__all__ = ["WorkerCommandError", "WorkerLostError", "WorkerProcess", "WorkerStartError"]


class WorkerLostError(RuntimeError):
    """The worker process died or its pipe broke."""


class WorkerStartError(RuntimeError):
    """The worker could not load its model; restarting it would not help."""


class WorkerCommandError(RuntimeError):
    """The worker is alive but a command failed inside it."""


class WorkerProcess:
    """Starts a worker (spawn context) and talks to it over a pipe of bytes."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._process, self._connection = spawn_child(
            worker_main, encode(settings), name="rollvault-generation-worker"
        )
        self.weight_version: int | None = None
        """The weights the worker holds (None: the model directory's own)."""

    @property
    def pid(self) -> int:
        pid = self._process.pid
        if pid is None:
            raise WorkerLostError("the worker process has no pid (never started)")
        return pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def wait_ready(self) -> Ready:
        """Block until the model is loaded; raise :class:`WorkerStartError` if it cannot be."""
        reply = self._receive()
        if isinstance(reply, WorkerFailed):
            raise WorkerStartError(f"generation worker {self.pid}: {reply.message}")
        if not isinstance(reply, Ready):
            raise WorkerLostError(f"generation worker {self.pid} sent {reply!r} before ready")
        return reply

    def load_weights(self, version: int, weights: bytes) -> None:
        reply = self._call(LoadWeights(version=version, weights=weights))
        if not isinstance(reply, WeightsLoaded) or reply.version != version:
            raise WorkerLostError(f"generation worker {self.pid}: unexpected reply {reply!r}")
        self.weight_version = version

    def generate(self, command: Generate) -> Generated:
        reply = self._call(command)
        if not isinstance(reply, Generated):
            raise WorkerLostError(f"generation worker {self.pid}: unexpected reply {reply!r}")
        return reply

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not. Idempotent."""
        stop_child(self._process, self._connection, encode(Shutdown()))

    def _call(self, command: WorkerCommand) -> WorkerReply:
        try:
            self._connection.send_bytes(encode(command))
        except (OSError, ValueError) as exc:
            raise WorkerLostError(f"generation worker {self.pid} is gone: {exc!r}") from exc
        reply = self._receive()
        if isinstance(reply, WorkerFailed):
            raise WorkerCommandError(f"generation worker {self.pid}: {reply.message}")
        return reply

    def _receive(self) -> WorkerReply:
        try:
            return decode_reply(self._connection.recv_bytes())
        except (EOFError, OSError, ValueError, msgspec.DecodeError) as exc:
            code = self._process.exitcode
            raise WorkerLostError(
                f"generation worker {self.pid} is gone (exit code {code}): {exc!r}"
            ) from exc
