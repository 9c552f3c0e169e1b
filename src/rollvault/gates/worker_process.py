"""The parent's handle on one generation worker process.

Blocking calls (send a command, wait for its reply); the gate runs them in a
thread. A worker that dies (killed, crashed, out of memory) shows up as
:class:`WorkerLostError` on the next call, or on the call in progress: the
parent closed its copy of the child's pipe end, so the pipe reports EOF as
soon as the worker is gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection

import msgspec

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

_STOP_TIMEOUT_S = 10.0


class WorkerLostError(RuntimeError):
    """The worker process died or its pipe broke."""


class WorkerStartError(RuntimeError):
    """The worker could not load its model; restarting it would not help."""


class WorkerCommandError(RuntimeError):
    """The worker is alive but a command failed inside it."""


class WorkerProcess:
    """Starts a worker (spawn context) and talks to it over a pipe of bytes."""

    def __init__(self, settings: WorkerSettings) -> None:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe(duplex=True)
        self._process = context.Process(
            target=worker_main,
            args=(child_end, encode(settings)),
            name="rollvault-generation-worker",
            daemon=True,
        )
        self._process.start()
        # Only the child may hold its end: then the child's death is EOF here.
        child_end.close()
        self._connection: Connection = parent_end
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
        # A worker already gone (or a pipe already closed) needs no asking.
        with contextlib.suppress(OSError, ValueError):
            self._connection.send_bytes(encode(Shutdown()))
        self._process.join(_STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()

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
