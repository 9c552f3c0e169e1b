"""RolloutRecoveryLedger.capture: an O(groups), copy-on-write, read-only view."""

from __future__ import annotations

import pytest
from ledger_testkit import Harness, payload

from rollvault.rollout_recovery import (
    LedgerError,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)


def test_a_capture_keeps_the_state_of_its_moment(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    before = harness.ledger.state_dict()
    captured = harness.mutate(harness.ledger.capture)
    harness.seal(group_id, 1)
    harness.fail(group_id, 2)
    other = harness.reserve(2)
    assert captured.state_dict() == before
    assert captured.group_ids() == [group_id]
    live = harness.group(group_id)
    assert [s.current_attempt.status for s in live.siblings] == [
        RolloutAttemptStatus.SEALED,
        RolloutAttemptStatus.SEALED,
        RolloutAttemptStatus.FAILED,
    ]
    assert harness.ledger.group_ids() == [group_id, other]


def test_records_are_shared_until_changed(harness: Harness) -> None:
    quiet, busy = harness.reserve(2), harness.reserve(2)
    captured = harness.mutate(harness.ledger.capture)
    harness.dispatch(busy)
    # The untouched group is still the very same record; the changed one was copied.
    assert captured._groups[quiet] is harness.ledger._groups[quiet]
    assert captured._groups[busy] is not harness.ledger._groups[busy]


def test_a_capture_is_read_only(harness: Harness) -> None:
    group_id = harness.reserve(2)
    captured = harness.mutate(harness.ledger.capture)
    with pytest.raises(LedgerError, match="read-only capture"):
        harness.mutate(lambda: captured.mark_group_dispatched(harness.cut, group_id))


def test_shared_groups_are_the_records_frozen_by_copy_on_write(harness: Harness) -> None:
    group_id = harness.reserve(2)
    shared = harness.mutate(harness.ledger.shared_groups)
    assert shared[0] is harness.ledger._groups[group_id]  # no copy was made
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    # The ledger copied the record before changing it: the shared one never changes.
    assert [s.current_attempt.status for s in shared[0].siblings] == [
        RolloutAttemptStatus.RESERVED,
        RolloutAttemptStatus.RESERVED,
    ]
    assert harness.group(group_id).siblings[0].current_attempt.status is (
        RolloutAttemptStatus.SEALED
    )


def test_binding_a_prompt_to_a_shared_group_leaves_the_shared_record_alone(
    harness: Harness,
) -> None:
    group_id = harness.reserve(2, idx=7)
    restored = RolloutRecoveryLedger.from_state_dict(harness.ledger.state_dict())
    harness.ledger = restored
    (shared,) = harness.mutate(restored.shared_groups)
    harness.call("bind_runtime_prompt", group_id, payload(7))
    assert shared.runtime_prompt_payload is None
    assert harness.group(group_id).prompt_payload == payload(7)
    # Only the shell was new: the siblings are still shared, so the next change
    # of them copies them first.
    assert restored._groups[group_id].siblings is shared.siblings
    harness.dispatch(group_id)
    assert shared.siblings[0].current_attempt.status is RolloutAttemptStatus.RESERVED
    assert harness.group(group_id).prompt_payload == payload(7)


def test_prepare_for_restart_copies_only_the_groups_it_changes(harness: Harness) -> None:
    ready = harness.ready_group(2)
    generating = harness.reserve(2)
    harness.dispatch(generating)
    captured = harness.mutate(harness.ledger.capture)
    harness.call("prepare_for_restart")
    assert harness.ledger._groups[ready] is captured._groups[ready]
    assert harness.ledger._groups[generating] is not captured._groups[generating]
    assert [s.current_attempt.status for s in harness.group(generating).siblings] == [
        RolloutAttemptStatus.RESERVED,
        RolloutAttemptStatus.RESERVED,
    ]


def test_a_capture_of_some_groups_copies_only_those_when_they_change(harness: Harness) -> None:
    kept, other = harness.reserve(2), harness.reserve(2)
    before = harness.ledger.get_group(kept)
    captured = harness.mutate(lambda: harness.ledger.capture([kept]))
    assert captured.group_ids() == [kept]
    shared_other = harness.ledger._groups[other]
    harness.dispatch(kept)
    harness.dispatch(other)
    assert captured.get_group(kept) == before  # copied before it changed
    assert harness.ledger._groups[other] is shared_other  # not captured: changed in place
    with pytest.raises(LedgerError, match="no group 'nope'"):
        harness.mutate(lambda: harness.ledger.capture(["nope"]))


def test_borrowed_groups_are_the_live_records_and_freeze_nothing(harness: Harness) -> None:
    group_id = harness.reserve(2)
    (borrowed,) = harness.mutate(harness.ledger.borrowed_groups)
    assert borrowed is harness.ledger._groups[group_id]
    harness.dispatch(group_id)
    # Not frozen: the change went into the same record, no copy was made.
    assert harness.ledger._groups[group_id] is borrowed
    assert borrowed.siblings[0].current_attempt.status is RolloutAttemptStatus.DISPATCHED


def test_a_borrowed_group_is_the_live_record_and_an_unknown_one_raises(
    harness: Harness,
) -> None:
    group_id = harness.reserve(2)
    borrowed = harness.ledger.borrowed_group(group_id)
    assert borrowed is harness.ledger._groups[group_id]
    assert borrowed == harness.ledger.get_group(group_id)
    harness.dispatch(group_id)
    # Not frozen: the change went into the same record, no copy was made.
    assert harness.ledger._groups[group_id] is borrowed
    assert borrowed.siblings[1].current_attempt.status is RolloutAttemptStatus.DISPATCHED
    with pytest.raises(LedgerError, match="no group 'nope'"):
        harness.ledger.borrowed_group("nope")


def test_a_captured_receipt_is_shared_by_the_unshared_copy_and_never_changes(
    harness: Harness,
) -> None:
    """Unsharing a captured group copies everything but its receipts, which nothing changes
    in place: a seal stores a new one, a discard drops it. The capture keeps its state
    through both, and what the ledger hands out still has receipts of its own."""
    group_id = harness.reserve(3, granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    harness.seal(group_id, 1)
    before = harness.ledger.state_dict()
    captured = harness.mutate(harness.ledger.capture)
    kept = captured._groups[group_id].siblings[1].current_attempt.receipt
    harness.fail(group_id, 2)  # unshares the group: sibling 1's receipt is the same dict
    live = harness.ledger._groups[group_id]
    assert live is not captured._groups[group_id]
    assert live.siblings[1].current_attempt.receipt is kept
    assert live.siblings[1].attempts is not captured._groups[group_id].siblings[1].attempts
    handed_out = harness.group(group_id).siblings[1].current_attempt.receipt
    assert handed_out == kept and handed_out is not kept
    assert isinstance(handed_out, dict)
    handed_out["staging_keys"].append("forged")
    harness.call("prepare_incomplete_retry", group_id)  # prompt_group: the sealed are discarded
    assert live.siblings[1].attempts[-2].receipt is None
    assert captured.state_dict() == before
    assert kept is not None and "forged" not in kept["staging_keys"]
