"""RolloutRecoveryLedger.capture: an O(groups), copy-on-write, read-only view."""

from __future__ import annotations

import pytest
from ledger_testkit import Harness

from rollvault.rollout_recovery import LedgerError, RolloutAttemptStatus


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
