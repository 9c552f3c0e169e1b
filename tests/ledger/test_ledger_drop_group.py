"""drop_group: giving a prompt group up for good, and when that is refused."""

from __future__ import annotations

import pytest
from ledger_testkit import Harness

from rollvault.rollout_recovery import LedgerTransitionError, PromptGroupStatus


def test_a_generating_group_with_nothing_in_flight_is_dropped(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    harness.fail(group_id, 1)
    harness.mutate(lambda: harness.ledger.abandon_unsealed(harness.cut, group_id))
    harness.mutate(lambda: harness.ledger.drop_group(harness.cut, group_id))
    assert group_id not in harness.ledger
    assert harness.ledger.expected_staging_keys() == set()


def test_an_attempt_in_flight_blocks_the_drop_and_changes_nothing(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id, [0])
    before = harness.ledger.state_dict()
    with pytest.raises(LedgerTransitionError, match=r"cannot drop: siblings \[0, 1, 2\]"):
        harness.mutate(lambda: harness.ledger.drop_group(harness.cut, group_id))
    assert harness.ledger.state_dict() == before


def test_a_sealed_group_may_be_dropped_but_not_a_finalizing_one(harness: Harness) -> None:
    ready = harness.reserve(2)
    harness.dispatch(ready)
    harness.seal_all(ready)
    assert harness.group(ready).status is PromptGroupStatus.READY_TO_FINALIZE
    harness.mutate(lambda: harness.ledger.drop_group(harness.cut, ready))
    assert ready not in harness.ledger

    finalizing = harness.reserve(2)
    harness.dispatch(finalizing)
    harness.seal_all(finalizing)
    harness.mutate(lambda: harness.ledger.mark_finalization_started(harness.cut, finalizing))
    with pytest.raises(LedgerTransitionError, match="finalizing"):
        harness.mutate(lambda: harness.ledger.drop_group(harness.cut, finalizing))
    assert finalizing in harness.ledger


def test_drop_requires_the_cut(harness: Harness) -> None:
    group_id = harness.reserve(1)
    with pytest.raises(Exception, match="mutation"):
        harness.outside_cut(lambda: harness.ledger.drop_group(harness.cut, group_id))
