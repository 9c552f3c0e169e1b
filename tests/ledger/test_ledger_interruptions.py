"""Failure kinds, and the attempts a restore records as interrupted by the process's death."""

from __future__ import annotations

import uuid

import msgspec
import pytest
from ledger_testkit import Harness, current_statuses

from rollvault.ledger.records import InterruptedAttempt
from rollvault.ledger.statuses import AttemptFailureKind
from rollvault.rollout_recovery import (
    InvalidLedgerInputError,
    LedgerTransitionError,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)

A = RolloutAttemptStatus
K = AttemptFailureKind


def interrupted(index: int, attempt_uuid: uuid.UUID | None = None) -> InterruptedAttempt:
    return InterruptedAttempt(
        generation_index=index,
        attempt_uuid=attempt_uuid or uuid.uuid4(),
        reason="interrupted: in flight when the process died",
    )


def current_uuid(harness: Harness, group_id: str, index: int) -> uuid.UUID:
    return harness.group(group_id).siblings[index].current_attempt.attempt_uuid


def test_a_failure_keeps_its_kind_through_the_persisted_state(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    gate = harness.gate_id(group_id, 1)
    harness.call(
        "mark_sibling_failed",
        group_id,
        generation_index=1,
        gate_rollout_id=gate,
        reason="data: environment rejects this prompt",
        failure_kind=K.DATA,
    )
    harness.fail(group_id, 0)  # the default kind is infra
    state = harness.ledger.state_dict()
    attempts = [sibling["attempts"][0] for sibling in state["groups"][0]["siblings"]]
    assert [attempt["failure_kind"] for attempt in attempts] == ["infra", "data"]
    restored = RolloutRecoveryLedger.from_state_dict(state).get_group(group_id)
    assert [s.current_attempt.failure_kind for s in restored.siblings] == [K.INFRA, K.DATA]


def test_a_failure_kind_must_be_the_enum(harness: Harness) -> None:
    group_id = harness.reserve(1)
    harness.dispatch(group_id)
    gate = harness.gate_id(group_id, 0)
    with pytest.raises(InvalidLedgerInputError, match="failure_kind must be an AttemptFailureKind"):
        harness.call(
            "mark_sibling_failed",
            group_id,
            generation_index=0,
            gate_rollout_id=gate,
            reason="x",
            failure_kind="data",
        )
    assert current_statuses(harness.group(group_id)) == [A.DISPATCHED]


@pytest.mark.parametrize("dispatched", [True, False])
def test_the_current_attempt_fails_as_interrupted(harness: Harness, dispatched: bool) -> None:
    # A reserved one too: the journal saw it dispatched after the snapshot.
    group_id = harness.reserve(2)
    if dispatched:
        harness.dispatch(group_id)
    target = current_uuid(harness, group_id, 1)
    harness.call("mark_attempt_interrupted", group_id, interrupted(1, target))
    sibling = harness.group(group_id).siblings[1]
    assert len(sibling.attempts) == 1
    attempt = sibling.current_attempt
    assert (attempt.status, attempt.failure_kind) == (A.FAILED, K.INTERRUPTED)
    assert attempt.failure_reason == "interrupted: in flight when the process died"
    # Sibling 0 is untouched, and the state is one the strict loader accepts.
    assert harness.group(group_id).siblings[0].current_attempt.failure_kind is None
    RolloutRecoveryLedger.from_state_dict(harness.ledger.state_dict())


def test_an_attempt_minted_after_the_snapshot_is_appended(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    later = uuid.uuid4()
    harness.call("mark_attempt_interrupted", group_id, interrupted(0, later))
    attempts = harness.group(group_id).siblings[0].attempts
    # The dispatched attempt it superseded ended with an outcome the process took along.
    assert [(a.status, a.failure_kind) for a in attempts] == [
        (A.ABANDONED, None),
        (A.FAILED, K.INTERRUPTED),
    ]
    assert attempts[-1].attempt_uuid == later
    with pytest.raises(LedgerTransitionError, match="already"):
        harness.call("mark_attempt_interrupted", group_id, interrupted(0, attempts[0].attempt_uuid))


def test_a_sealed_sibling_is_superseded_only_under_prompt_group(harness: Harness) -> None:
    atomic = harness.reserve(2, granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.dispatch(atomic)
    harness.seal(atomic, 0)
    harness.call("mark_attempt_interrupted", atomic, interrupted(0))
    discarded, failed = harness.group(atomic).siblings[0].attempts
    assert (discarded.status, discarded.receipt, discarded.staging_keys) == (A.ABANDONED, None, [])
    assert failed.failure_kind is K.INTERRUPTED

    per_sibling = harness.reserve(2)
    harness.dispatch(per_sibling)
    harness.seal(per_sibling, 0)
    before = harness.ledger.state_dict()
    with pytest.raises(LedgerTransitionError, match="cannot have been retried"):
        harness.call("mark_attempt_interrupted", per_sibling, interrupted(0))
    assert harness.ledger.state_dict() == before


def test_prepare_for_restart_mints_a_replacement_for_each_interrupted_failure(
    harness: Harness,
) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    harness.fail(group_id, 1)
    harness.call(
        "mark_attempt_interrupted", group_id, interrupted(2, current_uuid(harness, group_id, 2))
    )
    harness.call("prepare_for_restart")
    sealed, failed, redone = harness.group(group_id).siblings
    assert [a.status for a in sealed.attempts] == [A.SEALED]
    # An ordinary failure is left for the retry policy; the interrupted one is redone.
    assert [a.status for a in failed.attempts] == [A.FAILED]
    assert [(a.status, a.failure_kind) for a in redone.attempts] == [
        (A.FAILED, K.INTERRUPTED),
        (A.RESERVED, None),
    ]


def test_prepare_for_restart_redoes_a_whole_atomic_group_with_an_interruption(
    harness: Harness,
) -> None:
    group_id = harness.reserve(2, granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    harness.call(
        "mark_attempt_interrupted", group_id, interrupted(1, current_uuid(harness, group_id, 1))
    )
    harness.call("prepare_for_restart")
    first, second = harness.group(group_id).siblings
    assert [a.status for a in first.attempts] == [A.ABANDONED, A.RESERVED]
    assert [a.status for a in second.attempts] == [A.FAILED, A.RESERVED]


def test_interrupted_attempts_of_a_lost_group_go_before_the_first_attempt(
    harness: Harness,
) -> None:
    group_id = harness.reserve(2)
    first = current_uuid(harness, group_id, 1)
    carried = [interrupted(1), interrupted(1), interrupted(0)]
    harness.call("carry_interrupted_attempts", group_id, carried)
    record = harness.group(group_id)
    assert [len(sibling.attempts) for sibling in record.siblings] == [2, 3]
    lineage = record.siblings[1].attempts
    assert [a.attempt_uuid for a in lineage] == [
        carried[0].attempt_uuid,
        carried[1].attempt_uuid,
        first,
    ]
    assert [a.status for a in lineage] == [A.FAILED, A.FAILED, A.RESERVED]
    RolloutRecoveryLedger.from_state_dict(harness.ledger.state_dict())


def test_interrupted_attempts_are_carried_only_into_an_undispatched_group(
    harness: Harness,
) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id, [1])
    before = harness.ledger.state_dict()
    # Sibling 0 would be fine; sibling 1 is dispatched, so nothing changes at all.
    with pytest.raises(LedgerTransitionError):
        harness.call("carry_interrupted_attempts", group_id, [interrupted(0), interrupted(1)])
    with pytest.raises(InvalidLedgerInputError, match="generation_index 5"):
        harness.call("carry_interrupted_attempts", group_id, [interrupted(5)])
    assert harness.ledger.state_dict() == before


def test_interruptions_are_recorded_only_while_generating(harness: Harness) -> None:
    group_id = harness.ready_group(1)
    with pytest.raises(LedgerTransitionError, match="'ready_to_finalize'"):
        harness.call("mark_attempt_interrupted", group_id, interrupted(0))


def test_interruptions_recorded_at_once_equal_one_by_one(harness: Harness) -> None:
    one_by_one, at_once = harness.reserve(3), harness.reserve(3)
    for group_id in (one_by_one, at_once):
        harness.dispatch(group_id)
    later = uuid.uuid4()

    def items(group_id: str) -> list[InterruptedAttempt]:
        # A snapshot attempt, then one minted after it on the same sibling, then another.
        return [
            interrupted(0, current_uuid(harness, group_id, 0)),
            interrupted(0, later),
            interrupted(2, current_uuid(harness, group_id, 2)),
        ]

    for item in items(one_by_one):
        harness.call("mark_attempt_interrupted", one_by_one, item)
    harness.call("mark_attempts_interrupted", at_once, items(at_once))
    lineage = [
        [(a.status, a.failure_kind, a.failure_reason) for a in sibling.attempts]
        for sibling in harness.group(at_once).siblings
    ]
    assert lineage == [
        [(a.status, a.failure_kind, a.failure_reason) for a in sibling.attempts]
        for sibling in harness.group(one_by_one).siblings
    ]
    assert [len(sibling.attempts) for sibling in harness.group(at_once).siblings] == [2, 1, 1]


def test_interruptions_recorded_at_once_are_all_or_nothing(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 1)
    before = harness.ledger.state_dict()
    # The first two would be recorded; the third (a sealed sibling, sibling
    # granularity) is refused, after the first changed sibling 0's attempts.
    doomed = [
        interrupted(0, current_uuid(harness, group_id, 0)),
        interrupted(0),
        interrupted(1),
    ]
    with pytest.raises(LedgerTransitionError, match="cannot have been retried"):
        harness.call("mark_attempts_interrupted", group_id, doomed)
    assert harness.ledger.state_dict() == before
    with pytest.raises(InvalidLedgerInputError, match="expected InterruptedAttempt"):
        harness.call("mark_attempts_interrupted", group_id, [interrupted(0), "x"])
    assert harness.ledger.state_dict() == before


def test_interruptions_of_a_shared_group_leave_what_was_shared_as_it_was(
    harness: Harness,
) -> None:
    """``mark_attempts_interrupted`` on a group shared with a capture (``shared_groups``, as
    a snapshot's capture shares it): a batch goes into the copy that unshares the group,
    all of it or none, the next change into that copy, and the shared record never
    changes. (A restore records its interruptions with ``restart_interrupted``, which
    copies only the siblings it changes: the tests below.)"""
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 1)
    before = harness.ledger.state_dict()
    (shared,) = harness.ledger.shared_groups()
    frozen = msgspec.to_builtins(shared)
    doomed = [
        interrupted(0, current_uuid(harness, group_id, 0)),
        interrupted(0),
        interrupted(1),
    ]
    with pytest.raises(LedgerTransitionError, match="cannot have been retried"):
        harness.call("mark_attempts_interrupted", group_id, doomed)
    assert harness.ledger.state_dict() == before
    assert msgspec.to_builtins(shared) == frozen
    harness.call(
        "mark_attempts_interrupted",
        group_id,
        [interrupted(0, current_uuid(harness, group_id, 0)), interrupted(2)],
    )
    assert msgspec.to_builtins(shared) == frozen
    assert [len(s.attempts) for s in harness.group(group_id).siblings] == [1, 1, 2]
    assert current_statuses(harness.group(group_id)) == [A.FAILED, A.SEALED, A.FAILED]
    # Unshared now: the next change goes into the ledger's own record.
    harness.call("mark_attempts_interrupted", group_id, [interrupted(0)])
    assert msgspec.to_builtins(shared) == frozen
    assert [len(s.attempts) for s in harness.group(group_id).siblings] == [2, 1, 2]


def _lineages(harness: Harness, group_id: str) -> list[list[tuple[object, ...]]]:
    """Each sibling's attempts as (status, kind, reason, turn keys): all but fresh UUIDs."""
    return [
        [(a.status, a.failure_kind, a.failure_reason, a.turn_keys) for a in sibling.attempts]
        for sibling in harness.group(group_id).siblings
    ]


def _restart_shape(harness: Harness) -> tuple[str, str, str]:
    """Groups as a restore finds them: interrupted siblings, a sealed one, a failed one, one
    left reserved, and a finalizing group (a later sibling minted after the snapshot)."""
    mixed = harness.reserve(5)
    harness.dispatch(mixed, [0, 1, 2, 3])
    harness.seal(mixed, 1)
    harness.fail(mixed, 2)
    atomic = harness.reserve(2, granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.dispatch(atomic)
    harness.seal(atomic, 0)
    finalizing = harness.ready_group(2)
    harness.call("mark_finalization_started", finalizing)
    return mixed, atomic, finalizing


def _evidence(harness: Harness, mixed: str, atomic: str) -> dict[str, list[InterruptedAttempt]]:
    return {
        mixed: [interrupted(0, current_uuid(harness, mixed, 0)), interrupted(0)],
        atomic: [interrupted(1, current_uuid(harness, atomic, 1))],
    }


def test_restart_interrupted_equals_marking_then_prepare_for_restart() -> None:
    apart, together = Harness(), Harness()
    try:
        shapes = [_restart_shape(h) for h in (apart, together)]
        for harness in (apart, together):
            harness.ledger.shared_groups()  # as a restore's ledger seed shares them
        (mixed, atomic, _) = shapes[0]
        for group_id, items in _evidence(apart, mixed, atomic).items():
            apart.call("mark_attempts_interrupted", group_id, items)
        apart.call("prepare_for_restart")
        (mixed2, atomic2, _) = shapes[1]
        together.call("restart_interrupted", _evidence(together, mixed2, atomic2))
        for a, b in zip(shapes[0], shapes[1], strict=True):
            assert _lineages(apart, a) == _lineages(together, b)
            assert apart.group(a).status == together.group(b).status
        assert [len(s.attempts) for s in together.group(mixed2).siblings] == [3, 1, 1, 2, 2]
    finally:
        apart.close()
        together.close()


def test_a_restart_copies_a_shared_group_only_at_the_siblings_it_changes(
    harness: Harness,
) -> None:
    """The restore's ledger seed shares every loaded group: a restart's interruptions and
    replacements go into a copy of only the siblings they touch; the shared record, which
    stands for the loaded one, never changes, also once the run goes on changing the group."""
    mixed, atomic, _ = _restart_shape(harness)
    shared = {record.group_id: record for record in harness.ledger.shared_groups()}
    frozen = {group_id: msgspec.to_builtins(record) for group_id, record in shared.items()}
    harness.call("restart_interrupted", _evidence(harness, mixed, atomic))
    live = harness.ledger.borrowed_group(mixed)
    assert live.siblings is not shared[mixed].siblings  # a changed group, for the seed
    # The sealed and failed siblings are the shared ones, not copies; the interrupted (0)
    # and the live ones replaced (3 dispatched, 4 reserved) are copies.
    assert [live.siblings[i] is shared[mixed].siblings[i] for i in range(5)] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert {g: msgspec.to_builtins(r) for g, r in shared.items()} == frozen
    # Still shared at its other siblings: the next change copies the group whole first.
    harness.dispatch(mixed, [0, 3, 4])
    harness.seal(mixed, 4)
    assert {g: msgspec.to_builtins(r) for g, r in shared.items()} == frozen
    assert current_statuses(harness.group(mixed)) == [A.DISPATCHED, A.SEALED, A.FAILED] + [
        A.DISPATCHED,
        A.SEALED,
    ]


def test_a_restart_with_a_refused_interruption_leaves_the_shared_group_as_it_was(
    harness: Harness,
) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 1)
    (shared,) = harness.ledger.shared_groups()
    frozen = msgspec.to_builtins(shared)
    before = harness.ledger.state_dict()
    doomed = [interrupted(0, current_uuid(harness, group_id, 0)), interrupted(1)]
    with pytest.raises(LedgerTransitionError, match="cannot have been retried"):
        harness.call("restart_interrupted", {group_id: doomed})
    assert harness.ledger.state_dict() == before
    assert msgspec.to_builtins(shared) == frozen
    with pytest.raises(InvalidLedgerInputError, match="expected InterruptedAttempt"):
        harness.call("restart_interrupted", {group_id: [interrupted(0), "x"]})
    assert harness.ledger.state_dict() == before
