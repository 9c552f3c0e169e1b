"""The ledger writer's rewrite budget (issue 16): whole rewrites that chains past their bound
and segments of dead records call for are spread over snapshots. A snapshot rewrites by
choice at most its budget; only the hard bounds (a chain's bytes or length, the dead share
of the referenced bytes) force more; a chain or segment due is eventually rewritten; and the
ledger read back after many snapshots is the ledger written."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from rollvault.controller.snapshots import ledger_segments
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter, PendingLedger
from rollvault.ledger.ledger_records import decode_ledger_segment, resolve_group
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.state_convert import group_to_state
from rollvault.ledger.statuses import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

SIBLINGS = 8


@pytest.fixture(autouse=True)
def _dead_shares_these_cases_are_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases below are sized for compaction due past 0.4 of the referenced bytes dead
    and forced past 0.5 (the writer's thresholds when they were written): what they check
    is the mechanism (the budget, the priority, the forced share), not the thresholds."""
    monkeypatch.setattr(ledger_segments, "DEAD_DUE", 0.4)
    monkeypatch.setattr(ledger_segments, "DEAD_FORCED", 0.5)


def _attempt(rng: random.Random, status: RolloutAttemptStatus) -> RolloutAttemptRecord:
    return RolloutAttemptRecord(attempt_uuid=uuid.UUID(int=rng.getrandbits(128)), status=status)


def _group(group_id: str, rng: random.Random) -> PromptGroupRecoveryRecord:
    return PromptGroupRecoveryRecord(
        group_id=group_id,
        admission_id=f"a-{group_id}",
        prompt_id=f"p-{group_id}",
        prompt_ref=PromptRef(sample_id=f"s-{group_id}"),
        task_source=None,
        recovery_granularity=RecoveryGranularity.SIBLING,
        expected_generations=SIBLINGS,
        target_step=0,
        start_weight_version=0,
        siblings=[
            RolloutSiblingRecord(
                generation_index=index, attempts=[_attempt(rng, RolloutAttemptStatus.RESERVED)]
            )
            for index in range(SIBLINGS)
        ],
        phase=PromptGroupPhase.ADMITTED,
        status=PromptGroupStatus.GENERATING,
    )


def _changed(record: PromptGroupRecoveryRecord, rng: random.Random) -> PromptGroupRecoveryRecord:
    """``record`` with one sibling's attempt retried (a new siblings list, as the ledger's
    copy on write makes one)."""
    siblings = list(record.siblings)
    index = rng.randrange(len(siblings))
    attempts = [*siblings[index].attempts, _attempt(rng, RolloutAttemptStatus.DISPATCHED)]
    siblings[index] = RolloutSiblingRecord(generation_index=index, attempts=attempts)
    return msgspec.structs.replace(record, siblings=siblings)


def _read_all(directory: Path, pending: PendingLedger) -> list[object]:
    """Every group of ``pending``'s index, read back from the files on disk, as builtins."""
    segments = {
        ref.file: decode_ledger_segment((directory / ref.file).read_bytes(), name=ref.file)
        for ref in pending.index.segments
    }
    groups = []
    for position, ordinal in pending.index.groups:
        link = (pending.index.segments[position].file, ordinal)
        group, _chain = resolve_group(link, segments, set(), where="test")
        groups.append(msgspec.to_builtins(group))
    return groups


def _dead_share(pending: PendingLedger) -> float:
    """The referenced bytes no live chain reaches, estimated by record counts as the writer
    does."""
    live = Counter(file for placed in pending.placed.values() for file, _ in placed.chain)
    refs = {ref.file: ref for ref in pending.index.segments}
    total = sum(ref.byte_size for ref in refs.values())
    dead = sum(ref.byte_size * (1 - live[file] / ref.record_count) for file, ref in refs.items())
    return dead / total


def _whole_rewrites(directory: Path, pending: PendingLedger, before: set[str], stem: str) -> int:
    """Bytes of the whole records ``pending`` wrote (into its segments, named after ``stem``)
    for groups the previous snapshot had."""
    written = 0
    for group_id, placed in pending.placed.items():
        file, ordinal = placed.chain[0]
        if group_id not in before or not file.startswith(f"{stem}-") or len(placed.chain) > 1:
            continue
        data = (directory / file).read_bytes()
        raw = bytes(decode_ledger_segment(data, name=file).records[ordinal])
        assert msgspec.msgpack.decode(raw)[0] is None  # whole: no base
        written += len(raw)
    return written


class _Ledger:
    """A ledger of ``groups`` groups changing at random: ``changes`` groups a round, and
    ``replaced`` groups removed (finalized) and new ones added."""

    def __init__(self, directory: Path, groups: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.records = {f"g{n}": _group(f"g{n}", self.rng) for n in range(groups)}
        self.next = groups
        self.directory = directory
        self.writer = LedgerSegmentWriter(directory)
        self.round = 0

    def step(self, *, changes: int, replaced: int, removed: int = 0) -> None:
        for group_id in self.rng.sample(sorted(self.records), changes):
            self.records[group_id] = _changed(self.records[group_id], self.rng)
        for group_id in self.rng.sample(sorted(self.records), replaced + removed):
            del self.records[group_id]
        for _ in range(replaced):
            self.records[f"g{self.next}"] = _group(f"g{self.next}", self.rng)
            self.next += 1

    @property
    def stem(self) -> str:
        return f"{self.round:06d}"

    def write(self) -> PendingLedger:
        self.round += 1
        pending = self.writer.write(list(self.records.values()), stem=self.stem)
        assert _read_all(self.directory, pending) == [
            msgspec.to_builtins(group_to_state(r)) for r in self.records.values()
        ]
        self.writer.committed(pending)
        return pending


def test_a_snapshot_rewrites_by_choice_at_most_its_budget_and_restores_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bound forces anything here (the caps are out of reach): every whole record a
    group already placed gets is by choice, and their bytes are within the budget, which is
    spent on the most urgent first. 60 rounds; the ledger read back each time is the one
    written."""
    monkeypatch.setattr(ledger_segments, "DEAD_FORCED", 1.0)
    monkeypatch.setattr(ledger_segments, "CHAIN_BYTES_OVERDUE", 1e9)
    monkeypatch.setattr(ledger_segments, "MAX_CHAIN", 10**6)
    monkeypatch.setattr(ledger_segments, "REWRITE_SHARE", 0.5)
    ledger = _Ledger(tmp_path, groups=64, seed=1)
    ledger.write()
    spent = 0
    for _ in range(60):
        before = set(ledger.records)
        ledger.step(changes=24, replaced=2)
        pending = ledger.write()
        info = pending.info
        assert info.forced_records == 0
        assert info.rewritten_bytes <= info.budget
        assert _whole_rewrites(tmp_path, pending, before, ledger.stem) == info.rewritten_bytes
        spent += info.rewritten_bytes
    assert spent > 0  # chains came due and were rewritten


def test_a_due_segment_is_drained_within_the_budget_and_eventually_compacted(
    tmp_path: Path,
) -> None:
    """Groups replaced round after round leave the first snapshot's segment mostly dead; once
    due, the budget moves its live groups out a few at a time (here too few to keep up, so
    the forced share ends it), and it stops being referenced."""
    ledger = _Ledger(tmp_path, groups=64, seed=2)
    first = ledger.write()
    (whole,) = first.info.referenced
    spent = due = 0
    for _ in range(80):
        ledger.step(changes=4, replaced=2)
        pending = ledger.write()
        assert pending.info.rewritten_bytes <= pending.info.budget
        spent += pending.info.rewritten_bytes
        due += pending.info.queued_records
        if whole not in pending.info.referenced:
            break
    else:
        raise AssertionError("the first segment was never compacted")
    assert due > 0 and spent > 0  # it waited for the budget (queued), moved a part within it
    assert _dead_share(pending) <= ledger_segments.DEAD_FORCED


def test_with_no_budget_a_segment_is_compacted_at_once_past_the_forced_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no budget, a segment due compaction waits, but only until more than
    ``DEAD_FORCED`` of the referenced bytes is dead: then its live groups all leave it."""
    monkeypatch.setattr(ledger_segments, "REWRITE_SHARE", 0.0)
    ledger = _Ledger(tmp_path, groups=32, seed=3)
    (whole,) = ledger.write().info.referenced
    due = 0
    for _ in range(16):
        ledger.step(changes=0, replaced=0, removed=2)
        pending = ledger.write()
        assert pending.info.rewritten_bytes == 0
        if whole not in pending.info.referenced:
            break
        due += pending.info.queued_records
        assert pending.info.forced_records == 0
    else:
        raise AssertionError("the first segment was never compacted")
    assert due > 0  # due (past DEAD_DUE) for some snapshots first
    # 18 of its 32 records dead (> DEAD_FORCED): the 14 live groups rewritten together
    assert pending.info.forced_records == len(ledger.records) == 14
    assert pending.info.compacted_records == 14  # unchanged: into the cold segment
