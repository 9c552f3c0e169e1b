"""Which attempts a restore charges as interrupted, from the snapshot's ledger and the journal."""

from __future__ import annotations

import uuid

from ledger_records import DISPATCHED, INFRA, RESERVED, SEALED, group

from rollvault.controller.loop.dispatch_journal import (
    DispatchedLine,
    JournalAttempt,
    JournalTail,
)
from rollvault.controller.snapshots.crash_evidence import crash_evidence
from rollvault.ledger.records import InterruptedAttempt, PromptGroupRecoveryRecord
from rollvault.ledger.statuses import PromptGroupStatus

REASON = "interrupted: test"


def hex_of(record: PromptGroupRecoveryRecord, index: int, attempt: int = -1) -> str:
    return record.siblings[index].attempts[attempt].attempt_id


def line(seq: int, group_id: str, attempts: list[tuple[int, str]], idx: int = 7) -> DispatchedLine:
    return DispatchedLine(
        seq=seq,
        group_id=group_id,
        epoch=0,
        dataset_idx=idx,
        attempts=[JournalAttempt(generation_index=i, attempt_uuid=a) for i, a in attempts],
    )


def tail(*lines: DispatchedLine, returned: frozenset[str] | set[str] = frozenset()) -> JournalTail:
    return JournalTail(dispatched=list(lines), returned=frozenset(returned))


def charged(interrupted: list[InterruptedAttempt]) -> list[tuple[int, str]]:
    return [(a.generation_index, a.attempt_uuid.hex) for a in interrupted]


def test_a_dispatched_attempt_that_never_came_back_is_charged() -> None:
    record = group([DISPATCHED], [DISPATCHED], [SEALED])
    evidence = crash_evidence([record], tail(returned={hex_of(record, 1)}), reason=REASON)
    # Sibling 1 came back after the snapshot (its result is lost, but it killed nothing).
    assert charged(evidence.in_ledger["g"]) == [(0, hex_of(record, 0))]
    assert evidence.lost == [] and evidence.count == 1
    assert evidence.in_ledger["g"][0].reason == REASON


def test_a_reserved_attempt_is_charged_only_if_the_journal_saw_it_dispatched() -> None:
    record = group([RESERVED], [RESERVED])
    seen = tail(line(5, "g", [(1, hex_of(record, 1))]))
    assert charged(crash_evidence([record], seen, reason=REASON).in_ledger["g"]) == [
        (1, hex_of(record, 1))
    ]
    assert crash_evidence([record], tail(), reason=REASON).in_ledger == {}


def test_attempts_minted_after_the_snapshot_come_after_the_current_one() -> None:
    record = group([INFRA, DISPATCHED])
    later, last = uuid.uuid4().hex, uuid.uuid4().hex
    journal = tail(
        line(4, "g", [(0, later)]),
        line(6, "g", [(0, last)]),
        # An attempt the snapshot already shows superseded was reflected by it.
        line(7, "g", [(0, hex_of(record, 0, attempt=0))]),
        returned={later},
    )
    evidence = crash_evidence([record], journal, reason=REASON)
    assert charged(evidence.in_ledger["g"]) == [(0, hex_of(record, 0)), (0, last)]


def test_attempts_of_a_group_the_snapshot_does_not_hold_are_kept_for_its_prompt() -> None:
    a, b, c = (uuid.uuid4().hex for _ in range(3))
    journal = tail(
        line(3, "lost", [(0, a), (1, b)], idx=11), line(4, "done", [(0, c)]), returned={b, c}
    )
    evidence = crash_evidence([], journal, reason=REASON)
    assert evidence.in_ledger == {}
    ((lost),) = evidence.lost
    assert (lost.group_id, lost.epoch, lost.dataset_idx, lost.generation_index) == (
        "lost",
        0,
        11,
        0,
    )
    assert (lost.attempt_uuid, lost.reason) == (a, REASON)
    assert lost.interrupted_attempt().attempt_uuid.hex == a


def test_a_group_past_generating_is_not_charged() -> None:
    record = group([SEALED], [SEALED], status=PromptGroupStatus.READY_TO_FINALIZE)
    journal = tail(line(9, "g", [(0, uuid.uuid4().hex)]))
    assert crash_evidence([record], journal, reason=REASON).count == 0


def test_a_sibling_the_journals_replay_sealed_charges_no_attempt_minted_after_the_snapshot() -> (
    None
):
    # The snapshot held sibling 0's attempt A1 dispatched. A restart minted A3, which
    # died in flight; the next minted A4, which sealed (journaled) and died before a
    # snapshot; this restore adopted A4's seal onto A1 before it reads the dispatch
    # journal. A3 is superseded by the kept seal: charging it raised
    # LedgerTransitionError ("already supersedes it") and the restore failed (chaos
    # seed 171, 20 kills, under load).
    record = group([SEALED], [DISPATCHED])
    lost_in_flight = uuid.uuid4().hex
    journal = tail(line(4, "g", [(0, lost_in_flight), (1, hex_of(record, 1))]))
    evidence = crash_evidence([record], journal, reason=REASON)
    assert charged(evidence.in_ledger["g"]) == [(1, hex_of(record, 1))]
