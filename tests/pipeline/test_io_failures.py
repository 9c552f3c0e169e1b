"""Failed writes in a live run (an ENOSPC injected at the write layer).

A failed periodic snapshot is retried with a doubling wait and stops the run
only after ``max_consecutive_failures`` in a row; a failed trainer checkpoint
stops it at once; a log line that cannot be written stops it. Each stop
leaves the newest good state intact, and a restart finishes the run with
every prompt trained exactly once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from pathlib import Path

import pytest
from pipeline_helpers import (
    BatchKeepingTrainer,
    dataset_of,
    expected_prompts,
    run_simulated,
    small_config,
)

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.checkpoint_tools.verify import verify_checkpoint_dir
from rollvault.config.schema import RunConfig
from rollvault.controller.loop import append_only_file
from rollvault.controller.loop.io_failures import (
    LogWriteError,
    RunStoppedByIOError,
    SnapshotsFailingError,
    TrainerCheckpointWriteError,
)
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.controller.loop.run_logs import TRAIN_LOG_FILENAME
from rollvault.controller.snapshots import checkpointer
from rollvault.controller.snapshots.fact_writer import FactSegmentWriter
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter
from rollvault.controller.snapshots.snapshot_files import RolloutStateCapture
from rollvault.controller.snapshots.snapshot_schedule import BACKOFF_CAP, SnapshotSchedule
from rollvault.dataplane.interface import DataPlane
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.trainer_checkpoints import (
    trainer_checkpoint_steps,
    verify_trainer_checkpoint,
)
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.synthetic.environment import ParityEnvironment

SLOW = ("gate.simulated.latency_per_token_s=0.002", "rollout_checkpointing.interval_s=0.02")
SLOWER = ("gate.simulated.latency_per_token_s=0.008", "rollout_checkpointing.interval_s=0.02")
"""For tests that need several snapshot tries before the run ends, on a busy machine too."""


def _full_disk() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def _problems(config: RunConfig) -> list[str]:
    return check_exactly_once(
        read_run_history(Path(config.logging.log_dir)), expected_prompts(24, 2)
    )


def _run_expecting(config: RunConfig, trainer: BatchKeepingTrainer) -> RunStoppedByIOError:
    def gate(data_plane: DataPlane) -> SimulatedGate:
        return SimulatedGate(config.gate.simulated, data_plane, ParityEnvironment(), seed=0)

    with pytest.raises(RunStoppedByIOError) as raised:
        asyncio.run(run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config)))
    return raised.value


def _finish(config: RunConfig) -> RunSummary:
    summary, _ = run_simulated(config)
    assert summary.trainer_version == 12
    assert _problems(config) == []
    return summary


class PeriodicWrites:
    """Replaces the checkpointer's payload writer: fails periodic snapshots as ``plan`` says
    (True: fail, False: write; past its end, ``then``), records when each was tried."""

    def __init__(self, plan: list[bool], *, then: bool) -> None:
        self.plan = list(plan)
        self.then = then
        self.tried: list[tuple[float, bool]] = []
        self._real = checkpointer.write_snapshot_payload

    def __call__(
        self,
        capture: RolloutStateCapture,
        directory: Path,
        *,
        segments: SegmentedWriter | None,
        ledger: LedgerSegmentWriter | None,
        facts: FactSegmentWriter | None,
    ) -> int:
        if directory.parent.name != "rollout_snapshots":  # a trainer checkpoint's own
            return self._real(capture, directory, segments=segments, ledger=ledger, facts=facts)
        fail = self.plan.pop(0) if self.plan else self.then
        self.tried.append((time.monotonic(), fail))
        if fail:
            (directory / "partial.bin").write_bytes(b"x" * 1000)
            raise _full_disk()
        return self._real(capture, directory, segments=segments, ledger=ledger, facts=facts)


def test_the_wait_doubles_per_failure_up_to_the_cap_and_a_success_resets_it() -> None:
    retry = SnapshotSchedule(interval_s=0.5, max_consecutive_failures=6)
    waits = [retry.next_wait_s()]
    stops = []
    for _ in range(5):
        stops.append(retry.failed())
        waits.append(retry.next_wait_s())
    assert waits == [0.5, 1.0, 2.0, 4.0, 0.5 * BACKOFF_CAP, 0.5 * BACKOFF_CAP]
    assert stops == [False] * 5
    retry.succeeded()
    assert retry.next_wait_s() == 0.5
    assert [retry.failed() for _ in range(6)] == [False] * 5 + [True]


def test_failed_snapshots_are_retried_with_backoff_and_stop_the_run_after_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(
        tmp_path,
        *SLOWER,
        "rollout_checkpointing.max_consecutive_failures=3",
        "checkpointing.save_period=1000",
    )
    writes = PeriodicWrites([False, False], then=True)
    monkeypatch.setattr(checkpointer, "write_snapshot_payload", writes)
    with caplog.at_level(logging.WARNING, logger="rollvault.checkpointer"):
        stopped = _run_expecting(config, BatchKeepingTrainer())
    assert isinstance(stopped, SnapshotsFailingError)
    newest = (
        Path(config.checkpointing.checkpoint_dir) / "bootstrap/rollout_snapshots/snapshot_000002"
    )
    message = str(stopped)
    assert "3 rollout snapshot(s) in a row failed" in message
    assert "max_consecutive_failures=3" in message and "No space left on device" in message
    assert f"newest good snapshot is {newest}" in message
    warnings = [r.getMessage() for r in caplog.records if r.name == "rollvault.checkpointer"]
    assert len(warnings) == 2
    assert "(1 in a row; the run stops at 3)" in warnings[0] and str(newest) in warnings[0]
    assert "No space left on device" in warnings[1] and "trying again in 0.08 s" in warnings[1]
    # Each retry waited at least twice as long as the one before.
    failed_at = [at for at, fail in writes.tried if fail]
    assert len(failed_at) == 3
    gaps = [later - earlier for earlier, later in zip(failed_at, failed_at[1:], strict=False)]
    assert gaps[0] >= 0.04 and gaps[1] >= 0.08
    # The failures took their partial files with them; the committed snapshots verify.
    report = verify_checkpoint_dir(Path(config.checkpointing.checkpoint_dir))
    assert report.ok, report.problems
    assert report.leftovers == []
    assert newest.is_dir()
    monkeypatch.undo()
    _finish(config)


def test_a_success_resets_the_count_so_scattered_failures_never_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path, *SLOWER, "rollout_checkpointing.max_consecutive_failures=3")
    writes = PeriodicWrites([True, True, False] * 6, then=False)
    monkeypatch.setattr(checkpointer, "write_snapshot_payload", writes)
    with caplog.at_level(logging.WARNING, logger="rollvault.checkpointer"):
        summary, _ = run_simulated(config)
    assert summary.trainer_version == 12
    warnings = [r.getMessage() for r in caplog.records if r.name == "rollvault.checkpointer"]
    assert sum(fail for _, fail in writes.tried) >= 4 and len(warnings) >= 4
    assert any("(2 in a row" in w for w in warnings)
    assert not any("(3 in a row" in w for w in warnings)
    assert _problems(config) == []


class FailingCheckpointTrainer(BatchKeepingTrainer):
    """Its trainer state cannot be written after ``good`` checkpoints: the disk is full."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.good = good

    def save_checkpoint(self, directory: Path) -> None:
        if self.good == 0:
            (directory / "half.bin").write_bytes(b"x" * 1000)
            raise _full_disk()
        self.good -= 1
        super().save_checkpoint(directory)


def test_a_failed_trainer_checkpoint_stops_the_run_with_the_previous_one_intact(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path, *SLOW, "checkpointing.save_period=4")
    stopped = _run_expecting(config, FailingCheckpointTrainer(good=1))
    assert isinstance(stopped, TrainerCheckpointWriteError)
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    message = str(stopped)
    assert "the trainer checkpoint of step 8 could not be written" in message
    assert "No space left on device" in message
    assert f"The newest good state is {checkpoint_dir / 'step_4'}" in message
    assert trainer_checkpoint_steps(checkpoint_dir) == [4]
    assert verify_trainer_checkpoint(checkpoint_dir / "step_4") == []
    assert not [p for p in checkpoint_dir.iterdir() if p.name.startswith(("tmp_", "trash_"))]
    report = verify_checkpoint_dir(checkpoint_dir)
    assert report.ok, report.problems
    _finish(config)


class TrainLogOutage:
    """``os.write`` for the append-only files, failing for ``train_log.jsonl`` after
    ``good`` of its lines: the log's disk is full for good."""

    def __init__(self, good: int) -> None:
        self.good = good
        self._real = os.write

    def __call__(self, fd: int, data: memoryview | bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(TRAIN_LOG_FILENAME):
            if self.good == 0:
                raise _full_disk()
            self.good -= 1
        return self._real(fd, data)


def test_a_run_log_that_cannot_be_written_stops_the_run_and_nothing_goes_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(tmp_path, *SLOW, "checkpointing.save_period=4")
    monkeypatch.setattr(append_only_file, "SPACE_RETRY_BUDGET_S", 0.05)
    monkeypatch.setattr(append_only_file.os, "write", TrainLogOutage(good=21))
    stopped = _run_expecting(config, BatchKeepingTrainer())
    assert isinstance(stopped, LogWriteError)
    assert f"cannot write {Path(config.logging.log_dir) / TRAIN_LOG_FILENAME}" in str(stopped)
    assert "No space left on device (still after 0.05 s of retries)" in str(stopped)
    monkeypatch.undo()
    # The group whose line is missing was trained in memory only: the restart trains it again.
    _finish(config)


def test_a_dispatch_journal_that_cannot_be_written_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(tmp_path, *SLOW)
    real = os.write
    lines = {"left": 60}

    def journal_outage(fd: int, data: memoryview | bytes) -> int:
        # The parent directory, not a substring: this test's tmp_path is named
        # after it, so every file of the run has "dispatch_journal" in its path.
        if Path(os.readlink(f"/proc/self/fd/{fd}")).parent.name == "dispatch_journal":
            if lines["left"] == 0:
                raise OSError(errno.EIO, "Input/output error")
            lines["left"] -= 1
        return real(fd, data)

    monkeypatch.setattr(append_only_file.os, "write", journal_outage)
    stopped = _run_expecting(config, BatchKeepingTrainer())
    assert isinstance(stopped, LogWriteError)
    assert "dispatch_journal/segment_" in str(stopped) and "Input/output error" in str(stopped)
    monkeypatch.undo()
    _finish(config)


def test_a_failed_final_snapshot_is_a_warning_when_the_limit_is_not_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # No periodic snapshot before the end: the final one is the first, and it fails.
    config = small_config(tmp_path, "rollout_checkpointing.interval_s=3600")
    monkeypatch.setattr(checkpointer, "write_snapshot_payload", PeriodicWrites([True], then=True))
    with caplog.at_level(logging.WARNING, logger="rollvault.checkpointer"):
        summary, _ = run_simulated(config)
    assert summary.trainer_version == 12 and summary.snapshots_written == 0
    assert any("rollout snapshot failed (1 in a row" in r.getMessage() for r in caplog.records)
    assert _problems(config) == []
