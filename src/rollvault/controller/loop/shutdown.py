"""A request to stop a run early (preemption), and the record of what the stop kept.

SLURM, Kubernetes and spot-instance reclaim stop a job with SIGTERM and, a
grace period later, SIGKILL. The command line turns the first SIGTERM or
SIGINT into :meth:`Shutdown.request`; tests call it directly. The pipeline
(:func:`rollvault.controller.loop.pipeline.run_pipeline`) owns what happens
next: it stops dispatching, writes a final rollout snapshot within
``rollout_checkpointing.shutdown_grace_s`` of the request, and returns a
summary saying where a restart resumes (:func:`record_shutdown`).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import (
    SHUTDOWNS_LOG_FILENAME,
    JsonlWriter,
    ShutdownLogRecord,
)
from rollvault.controller.snapshots.checkpointer import (
    TRAINER_ROLLOUT_STATE_DIRNAME,
    Checkpointer,
)
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.statuses import RolloutAttemptStatus

__all__ = ["Shutdown", "record_shutdown"]


class Shutdown:
    """A one-time request to stop the run, with the signal that asked and its loop time.

    Create and use it on the event loop that runs the pipeline. Only the
    first request counts: a later one changes nothing (what a second signal
    does is the caller's business; ``rollvault run`` exits at once).
    """

    def __init__(self) -> None:
        self._requested = asyncio.Event()
        self._signal: signal.Signals | None = None
        self._requested_at: float | None = None

    def request(self, signum: signal.Signals) -> bool:
        """Ask the run to stop because of ``signum``; True for the first request, else False."""
        if self._signal is not None:
            return False
        self._signal = signum
        self._requested_at = asyncio.get_running_loop().time()
        self._requested.set()
        return True

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._signal is not None

    @property
    def signal(self) -> signal.Signals | None:
        """The signal of the first request (None: no request yet)."""
        return self._signal

    async def wait(self) -> None:
        """Return once a stop is requested."""
        await self._requested.wait()

    def deadline(self, grace_s: float) -> float:
        """The loop time ``grace_s`` seconds after the request; raises if there was none."""
        if self._requested_at is None:
            raise RuntimeError("Shutdown.deadline: no stop was requested")
        return self._requested_at + grace_s

    def seconds_since_request(self) -> float:
        """Loop seconds since the request; raises if there was none."""
        return asyncio.get_running_loop().time() - self.deadline(0.0)


def record_shutdown(
    parts: RolloutParts,
    checkpointer: Checkpointer | None,
    shutdown: Shutdown,
    final_snapshot: Path | None,
    *,
    grace_exceeded: bool,
) -> ShutdownLogRecord:
    """Log where a restart of the stopped run resumes, in ``shutdowns.jsonl``."""
    assert shutdown.signal is not None
    resume_from = final_snapshot or (_newest_snapshot(checkpointer) if checkpointer else None)
    record = ShutdownLogRecord(
        incarnation=parts.logs.incarnation,
        signal=shutdown.signal.name,
        checkpoint_dir=parts.config.checkpointing.checkpoint_dir,
        final_snapshot=str(final_snapshot) if final_snapshot else None,
        resume_from=str(resume_from) if resume_from else None,
        grace_exceeded=grace_exceeded,
        attempts_in_flight=_attempts_in_flight(parts.ledger),
        trainer_version=parts.trainer_version,
        base_train_step=parts.base_step,
        seconds=shutdown.seconds_since_request(),
    )
    log: JsonlWriter[ShutdownLogRecord] = JsonlWriter(
        Path(parts.config.logging.log_dir) / SHUTDOWNS_LOG_FILENAME, parts.logs.sequence
    )
    try:
        log.write(record)
    finally:
        log.close()
    return record


def _newest_snapshot(checkpointer: Checkpointer) -> Path | None:
    """The newest committed snapshot of the current anchor, or its trainer checkpoint's own."""
    anchor = checkpointer.anchor()
    committed = committed_snapshot_paths(snapshots_root(anchor))
    if committed:
        return committed[-1]
    embedded = anchor / TRAINER_ROLLOUT_STATE_DIRNAME
    return embedded if embedded.is_dir() else None


def _attempts_in_flight(ledger: RolloutRecoveryLedger) -> int:
    return sum(
        sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED
        for group in ledger.groups()
        for sibling in group.siblings
    )
