"""When periodic snapshots fall due: one interval after the newest committed state, a
trainer checkpoint's included, with a doubling wait after failures; with the seal
journal on, also once it grew by ``journal.snapshot_after_mib``, or stopped."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
from pipeline_helpers import dataset_of, small_config
from test_group_entries import _reserve
from test_incremental_snapshots import Run
from test_seal_journal import _seal

from rollvault.config.schema import RunConfig
from rollvault.controller.loop.seal_journal import SealJournal
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_schedule import (
    BACKOFF_CAP,
    JOURNALED_INTERVAL_S,
    UNJOURNALED_INTERVAL_S,
    SnapshotSchedule,
    interval_for,
)


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


LIMIT_MIB = 0.01
LIMIT_BYTES = int(LIMIT_MIB * 2**20)


def _journal_config(tmp_path: Path) -> RunConfig:
    return small_config(
        tmp_path,
        "rollout_checkpointing.interval_s=600",  # never due by time in these tests
        f"rollout_checkpointing.journal.snapshot_after_mib={LIMIT_MIB}",
    )


class Tries:
    """A run's periodic snapshots going, each try recorded: the journal's bytes
    then, and whether it committed."""

    def __init__(self, run: Run) -> None:
        self.run = run
        journal = self.run.parts.seal_journal
        assert journal is not None
        self.journal = journal
        self.made: list[tuple[int, bool]] = []
        self.changed = asyncio.Event()
        self._inner = self.run.checkpointer.snapshot_if_changed
        self.run.checkpointer.snapshot_if_changed = self  # type: ignore[method-assign]
        self._periodic: asyncio.Task[None] | None = None

    async def start(self, *, reserve: bool = True) -> None:
        """Something to snapshot (a new group, unless ``reserve`` is false), then the
        periodic snapshots."""
        if reserve:
            await _reserve(self.run.parts, sealed=1, gate=self.run.gate)
        self._periodic = asyncio.create_task(self.run.checkpointer.run_periodic())
        await asyncio.sleep(0)  # it waits now

    async def stop(self) -> None:
        assert self._periodic is not None
        self.run.checkpointer.stop()
        await self._periodic
        self.run.parts.logs.close()
        self.journal.close()

    async def __call__(self) -> Path | None:
        appended = self.journal.bytes_appended
        path = await self._inner()
        self.made.append((appended, path is not None))
        self.changed.set()
        return path

    async def next(self) -> tuple[int, bool]:
        count = len(self.made)
        while len(self.made) == count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=10)
        return self.made[-1]


def _grow(journal: SealJournal, until: int) -> None:
    while journal.bytes_appended < until:
        journal.step(1, ["g" * 200])  # changes no state: a snapshot of it alone is skipped


def test_the_journal_growing_by_snapshot_after_mib_makes_a_periodic_snapshot_due(
    tmp_path: Path,
) -> None:
    """With the seal journal on, a snapshot falls due once the journal grew by the limit
    since the newest committed state, long before ``interval_s``; a try that wrote nothing
    (skipped: nothing changed) waits for another limit's worth, not a hot loop."""

    async def main() -> tuple[list[tuple[int, bool]], int]:
        tries = Tries(Run.fresh(_journal_config(tmp_path)))
        journal = tries.journal
        await tries.start()
        _grow(journal, LIMIT_BYTES // 2)
        await asyncio.sleep(0.2)  # what is tested is that nothing happens
        assert tries.made == []
        _grow(journal, LIMIT_BYTES)
        first = await tries.next()
        covered = journal.covered_bytes
        _grow(journal, covered + LIMIT_BYTES)  # steps only: this try has nothing to write
        second = await tries.next()
        _grow(journal, second[0] + LIMIT_BYTES // 2)
        await asyncio.sleep(0.2)
        assert len(tries.made) == 2  # the skipped try did not make the next one due at once
        await _reserve(tries.run.parts, sealed=1, gate=tries.run.gate)
        _grow(journal, second[0] + LIMIT_BYTES)
        await tries.next()
        await tries.stop()
        assert first[1] and covered >= LIMIT_BYTES
        return tries.made, covered

    made, covered = asyncio.run(main())
    assert [committed for _, committed in made] == [True, False, True]
    assert covered <= made[0][0] + LIMIT_BYTES  # counted from that snapshot's capture
    assert made[1][0] >= covered + LIMIT_BYTES and made[2][0] >= made[1][0] + LIMIT_BYTES


def test_a_journal_that_stops_makes_one_snapshot_due_at_once(tmp_path: Path) -> None:
    """Its seals are kept by the snapshots alone from then on: one now keeps those sealed
    so far; then the interval alone (here 600 s) makes the next due."""

    async def main() -> list[tuple[int, bool]]:
        tries = Tries(Run.fresh(_journal_config(tmp_path)))
        await tries.start()
        unencodable = msgspec.structs.replace(_seal(), receipt={"reward": 1j})
        assert tries.journal.seal(unencodable) is None and tries.journal.failure is not None
        await tries.next()
        await _reserve(tries.run.parts, sealed=1, gate=tries.run.gate)
        await asyncio.sleep(0.2)
        assert len(tries.made) == 1
        await tries.stop()
        return tries.made

    assert [committed for _, committed in asyncio.run(main())] == [True]


def test_the_default_interval_is_a_minute_with_the_journal_and_seconds_without() -> None:
    assert interval_for(None, journal_keeps_seals=True) == JOURNALED_INTERVAL_S == 60.0
    assert interval_for(None, journal_keeps_seals=False) == UNJOURNALED_INTERVAL_S == 5.0
    assert interval_for(2.5, journal_keeps_seals=True) == 2.5  # a set interval is kept


def test_a_default_interval_shortens_when_the_journal_stops(tmp_path: Path) -> None:
    """Without the journal a kill loses what was sealed since the newest snapshot: from
    the journal's failure on, the default interval is the one for a run without it."""
    config = small_config(tmp_path, f"rollout_checkpointing.journal.snapshot_after_mib={LIMIT_MIB}")
    assert config.rollout_checkpointing.interval_s is None
    without = small_config(tmp_path / "off", "rollout_checkpointing.journal.enabled=false")
    assert Run.fresh(without).checkpointer.interval_s == UNJOURNALED_INTERVAL_S

    async def main() -> tuple[float, float, list[tuple[int, bool]]]:
        tries = Tries(Run.fresh(config))
        before = tries.run.checkpointer.interval_s
        await tries.start()
        unencodable = msgspec.structs.replace(_seal(), receipt={"reward": 1j})
        assert tries.journal.seal(unencodable) is None
        await tries.next()
        after = tries.run.checkpointer.interval_s
        await tries.stop()
        return before, after, tries.made

    before, after, made = asyncio.run(main())
    assert (before, after) == (JOURNALED_INTERVAL_S, UNJOURNALED_INTERVAL_S)
    assert [committed for _, committed in made] == [True]


def test_a_restart_whose_journal_holds_the_limit_snapshots_at_once(tmp_path: Path) -> None:
    """A run killed more often than its journal grows by the limit (and than the interval)
    must still make its journal, hence a restore's replay, end: the restart counts the
    journal it opened with, so its first periodic snapshot is due at once."""
    config = _journal_config(tmp_path)

    async def first_start() -> int:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=1, gate=run.gate)
        await run.snapshot()
        journal = run.parts.seal_journal
        assert journal is not None
        _grow(journal, 2 * LIMIT_BYTES)
        run.parts.logs.close()
        journal.close()  # the kill: no snapshot covers what was journaled since
        return journal.bytes_appended

    journaled = asyncio.run(first_start())
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None

    async def restart() -> tuple[int, tuple[int, bool]]:
        tries = Tries(await Run.restored(config, source))
        opened_with = tries.journal.bytes_appended
        await tries.start(reserve=False)
        made = await tries.next()  # within next()'s 10 s: the interval is 600 s
        await tries.stop()
        return opened_with, made

    opened_with, made = asyncio.run(restart())
    assert opened_with >= LIMIT_BYTES and journaled >= 2 * LIMIT_BYTES
    assert made == (opened_with, True)  # the restored state, written before any new seal
