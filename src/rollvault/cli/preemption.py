"""How ``rollvault run`` answers SIGTERM and SIGINT: stop in order, then exit 143 or 130.

SLURM, Kubernetes and spot-instance reclaim send SIGTERM, then SIGKILL after a
grace period; a terminal sends SIGINT on Ctrl-C. While the run is on its event
loop (:func:`stop_on_signals`), the first of them requests the run's
:class:`~rollvault.controller.loop.shutdown.Shutdown`: the pipeline stops
dispatching and writes a final rollout snapshot within
``rollout_checkpointing.shutdown_grace_s``. A second signal exits at once
(:func:`exit_now`). Outside the loop (loading the model, the warm-up, the
report; :func:`raise_on_signals`) a signal raises :class:`Preempted`: nothing
of the run's checkpoint directory is being written then, so there is nothing
to finish.

The exit code is the one a shell gives a process killed by the signal,
128 + its number (:func:`exit_code`: 143 for SIGTERM, 130 for SIGINT), so a
scheduler sees a preempted job, not a failed one; and there is no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final, NoReturn

from rollvault.controller.loop.run_logs import ShutdownLogRecord
from rollvault.controller.loop.shutdown import Shutdown

__all__ = [
    "PREEMPTION_SIGNALS",
    "Preempted",
    "exit_code",
    "exit_now",
    "raise_on_signals",
    "stop_message",
    "stop_on_signals",
]

PREEMPTION_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], object] | int | None


class Preempted(BaseException):
    """SIGTERM or SIGINT outside the event loop.

    A ``BaseException``, like ``KeyboardInterrupt``, so that no ``except
    Exception`` on the way (a loader, the warm-up) swallows it.
    """

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(signum.name)
        self.signum = signum


def exit_code(signum: signal.Signals) -> int:
    """The shell's exit status of a process killed by ``signum``: 128 + its number."""
    return 128 + int(signum)


def exit_now(code: int) -> NoReturn:
    """End this process at once with ``code``, after killing the worker processes it started.

    No cleanup runs and no thread is waited for; nothing durable needs it:
    snapshots and checkpoints are published by atomic rename (one being
    written stays a ``tmp_`` directory, never read and removed by the next
    start), log lines are flushed as they are written, and the run lock is an
    OS lock that ends with the process.
    """
    for child in multiprocessing.active_children():
        child.kill()  # our own children (the generation worker), by their pids
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _raise_preempted(signum: int, frame: FrameType | None) -> None:
    raise Preempted(signal.Signals(signum))


@contextlib.contextmanager
def raise_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise :class:`Preempted` (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = _install(_raise_preempted)
    try:
        yield
    finally:
        _restore(previous)


@contextlib.contextmanager
def stop_on_signals(
    shutdown: Shutdown, *, grace_s: float, announce: Callable[[str], None]
) -> Iterator[None]:
    """While inside (on the running loop): the first signal requests ``shutdown``, a second
    exits at once. ``announce`` prints a line for the user."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in PREEMPTION_SIGNALS}
    for sig in PREEMPTION_SIGNALS:
        loop.add_signal_handler(sig, _on_signal, shutdown, sig, grace_s, announce)
    try:
        yield
    finally:
        for sig in PREEMPTION_SIGNALS:
            loop.remove_signal_handler(sig)
        # Removing a loop handler sets the default; what was there before comes back.
        _restore(previous)


def _on_signal(
    shutdown: Shutdown, signum: signal.Signals, grace_s: float, announce: Callable[[str], None]
) -> None:
    if shutdown.request(signum):
        announce(
            f"rollvault run: {signum.name}: stopping: no new attempts, a final rollout snapshot "
            f"within {grace_s:g} s (rollout_checkpointing.shutdown_grace_s); "
            "a second signal exits at once"
        )
        return
    announce(
        f"rollvault run: second signal ({signum.name}): exiting now, without the final snapshot; "
        "a restart resumes from the last committed one"
    )
    exit_now(exit_code(signum))


def _install(handler: Callable[[int, FrameType | None], None]) -> dict[signal.Signals, _Handler]:
    previous: dict[signal.Signals, _Handler] = {}
    for sig in PREEMPTION_SIGNALS:
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, handler)
    return previous


def _restore(previous: dict[signal.Signals, _Handler]) -> None:
    for sig, handler in previous.items():
        # None: a handler not set from Python; the default is the closest we can restore.
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def stop_message(stopped: ShutdownLogRecord, *, grace_s: float) -> str:
    """The line on stderr that says what a stopped run kept and where a restart resumes."""
    where = f"under {stopped.checkpoint_dir}"
    if stopped.resume_from is None:
        resume = f"no rollout snapshot exists yet {where}: a restart begins from scratch"
    else:
        resume = f"a restart (the same command) resumes from {stopped.resume_from} {where}"
    head = f"rollvault run: stopped by {stopped.signal} after {stopped.seconds:.1f} s"
    if stopped.grace_exceeded:
        return (
            f"{head}: the final snapshot did not finish within {grace_s:g} s "
            f"(rollout_checkpointing.shutdown_grace_s); the last committed snapshot is what "
            f"a restart will use: {resume}"
        )
    kept = (
        f"final rollout snapshot {stopped.final_snapshot}"
        if stopped.final_snapshot is not None
        else "nothing changed since the last snapshot"
    )
    return (
        f"{head} at step {stopped.trainer_version}: {kept}; {stopped.attempts_in_flight} "
        f"attempts in flight will be redone; {resume}"
    )
