"""When periodic snapshots fall due: one interval after the newest committed state, a
trainer checkpoint's included, with a doubling wait after failures."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pipeline_helpers import small_config
from test_group_entries import _reserve
from test_incremental_snapshots import Run

from rollvault.controller.snapshots.snapshot_schedule import BACKOFF_CAP, SnapshotSchedule


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_snapshot_is_due_one_interval_after_the_start_and_each_next_after_a_try() -> None:
    clock = FakeClock()
    schedule = SnapshotSchedule(interval_s=5.0, max_consecutive_failures=3, clock=clock)
    clock.now += 30.0  # built long before the run starts
    schedule.start()
    assert schedule.due_in_s() == 5.0
    clock.now += 5.0
    assert schedule.due_in_s() == 0.0
    schedule.tried()
    assert schedule.due_in_s() == 5.0
    assert not schedule.failed()
    schedule.tried()
    assert schedule.due_in_s() == 10.0  # the wait doubled after a failure


def test_a_trainer_checkpoint_moves_the_due_time_to_one_interval_after_it_never_earlier() -> None:
    clock = FakeClock()
    schedule = SnapshotSchedule(interval_s=5.0, max_consecutive_failures=9, clock=clock)
    schedule.start()
    clock.now += 4.0
    schedule.committed_elsewhere()
    assert schedule.due_in_s() == 5.0
    for _ in range(3):
        schedule.failed()
    schedule.tried()  # after 3 failures in a row: 8 intervals
    clock.now += 1.0
    schedule.committed_elsewhere()
    assert schedule.due_in_s() == 5.0 * min(2**3, BACKOFF_CAP) - 1.0


INTERVAL_S = 2.0


def test_a_trainer_checkpoint_defers_the_next_periodic_snapshot(tmp_path: Path) -> None:
    """The periodic snapshot due one interval after the start is not written: a trainer
    checkpoint half-way committed the run's state, and the next is due one interval
    after that checkpoint."""
    config = small_config(tmp_path, f"rollout_checkpointing.interval_s={INTERVAL_S}")

    async def main() -> tuple[float, list[float]]:
        run = Run.fresh(config)
        checkpointer = run.checkpointer
        written: list[float] = []
        first_written = asyncio.Event()
        snapshot_if_changed = checkpointer.snapshot_if_changed

        async def recorded() -> Path | None:
            path = await snapshot_if_changed()
            written.append(time.monotonic() - started)
            first_written.set()
            return path

        checkpointer.snapshot_if_changed = recorded  # type: ignore[method-assign]
        await _reserve(run.parts, sealed=1, gate=run.gate)
        started = time.monotonic()
        periodic = asyncio.create_task(checkpointer.run_periodic())
        await asyncio.sleep(INTERVAL_S / 2)  # the clock is what is tested
        run.parts.trainer_version = 1
        await checkpointer.trainer_checkpoint()
        checkpointed = time.monotonic() - started
        await _reserve(run.parts, sealed=1, gate=run.gate)  # something new to snapshot
        await asyncio.wait_for(first_written.wait(), timeout=10 * INTERVAL_S)
        checkpointer.stop()
        await periodic
        run.parts.logs.close()
        assert checkpointer.stats.snapshots == len(written) == 1, written
        return checkpointed, written

    checkpointed, written = asyncio.run(main())
    assert checkpointed < INTERVAL_S  # else the test proves nothing: the old due time passed
    assert written[0] >= checkpointed + INTERVAL_S
