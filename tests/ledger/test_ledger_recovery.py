"""Failure, retry and restart at both recovery granularities; staging keys; discards; checkpoint safety."""

from __future__ import annotations

import pytest
from ledger_testkit import Harness, current_statuses

from rollvault.rollout_recovery import (
    CheckpointUnsafeError,
    InvalidLedgerInputError,
    LedgerError,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

A = RolloutAttemptStatus
SIBLING = RecoveryGranularity.SIBLING
PROMPT_GROUP = RecoveryGranularity.PROMPT_GROUP


def mixed_group(harness: Harness, granularity: RecoveryGranularity) -> str:
    """4 siblings: 0 sealed, 1 failed, 2 dispatched, 3 reserved."""
    group_id = harness.reserve(4, granularity=granularity)
    harness.dispatch(group_id, [0, 1, 2])
    harness.seal(group_id, 0)
    harness.fail(group_id, 1)
    return group_id


def attempt_counts(harness: Harness, group_id: str) -> list[int]:
    return [len(sibling.attempts) for sibling in harness.group(group_id).siblings]


def sealed_keys(harness: Harness, group_id: str) -> set[str]:
    return set(harness.group(group_id).siblings[0].attempts[-1].staging_keys)


def test_abandon_unsealed_keeps_sealed_siblings_at_sibling_granularity(harness: Harness) -> None:
    group_id = mixed_group(harness, SIBLING)
    keys = sealed_keys(harness, group_id)
    harness.call("abandon_unsealed", group_id)
    assert current_statuses(harness.group(group_id)) == [
        A.SEALED,
        A.FAILED,
        A.ABANDONED,
        A.ABANDONED,
    ]
    assert harness.ledger.expected_staging_keys() == keys
    assert attempt_counts(harness, group_id) == [1, 1, 1, 1], "abandoning mints nothing"


def test_abandon_unsealed_abandons_the_whole_cohort_at_prompt_group_granularity(
    harness: Harness,
) -> None:
    group_id = mixed_group(harness, PROMPT_GROUP)
    harness.call("abandon_unsealed", group_id)
    record = harness.group(group_id)
    assert current_statuses(record) == [A.ABANDONED, A.FAILED, A.ABANDONED, A.ABANDONED]
    assert harness.ledger.expected_staging_keys() == set()
    discarded = record.siblings[0].attempts[-1]
    assert (discarded.receipt, discarded.reward, discarded.staging_keys) == (None, None, [])
    assert record.status is PromptGroupStatus.GENERATING


def test_retry_mints_only_for_failed_and_abandoned_siblings_at_sibling_granularity(
    harness: Harness,
) -> None:
    group_id = mixed_group(harness, SIBLING)
    keys = sealed_keys(harness, group_id)
    before = harness.group(group_id)
    record = harness.call("prepare_incomplete_retry", group_id)
    assert attempt_counts(harness, group_id) == [1, 2, 1, 1]
    assert current_statuses(record) == [A.SEALED, A.RESERVED, A.DISPATCHED, A.RESERVED]
    assert record.siblings[1].attempts[0].status is A.FAILED
    assert (
        record.siblings[1].attempts[1].attempt_uuid != before.siblings[1].attempts[0].attempt_uuid
    )
    assert harness.ledger.expected_staging_keys() == keys
    harness.dispatch(group_id)
    assert current_statuses(harness.group(group_id)) == [
        A.SEALED,
        A.DISPATCHED,
        A.DISPATCHED,
        A.DISPATCHED,
    ]


def test_retry_replaces_the_whole_cohort_at_prompt_group_granularity(harness: Harness) -> None:
    group_id = mixed_group(harness, PROMPT_GROUP)
    record = harness.call("prepare_incomplete_retry", group_id)
    assert attempt_counts(harness, group_id) == [2, 2, 2, 2]
    assert current_statuses(record) == [A.RESERVED] * 4
    assert [sibling.attempts[0].status for sibling in record.siblings] == [
        A.ABANDONED,
        A.FAILED,
        A.ABANDONED,
        A.ABANDONED,
    ]
    assert harness.ledger.expected_staging_keys() == set()


def test_restart_at_sibling_granularity_redoes_only_interrupted_siblings(harness: Harness) -> None:
    group_id = mixed_group(harness, SIBLING)
    keys = sealed_keys(harness, group_id)
    harness.call("prepare_for_restart")
    record = harness.group(group_id)
    assert attempt_counts(harness, group_id) == [1, 1, 2, 2]
    assert current_statuses(record) == [A.SEALED, A.FAILED, A.RESERVED, A.RESERVED]
    assert [sibling.attempts[0].status for sibling in record.siblings[2:]] == [
        A.ABANDONED,
        A.ABANDONED,
    ]
    assert harness.ledger.expected_staging_keys() == keys, (
        "a sealed sibling is never generated again"
    )


def test_restart_at_prompt_group_granularity_redoes_the_whole_cohort(harness: Harness) -> None:
    group_id = mixed_group(harness, PROMPT_GROUP)
    harness.call("prepare_for_restart")
    record = harness.group(group_id)
    assert attempt_counts(harness, group_id) == [2, 2, 2, 2]
    assert current_statuses(record) == [A.RESERVED] * 4
    assert [sibling.attempts[0].status for sibling in record.siblings] == [
        A.ABANDONED,
        A.FAILED,
        A.ABANDONED,
        A.ABANDONED,
    ]
    assert harness.ledger.expected_staging_keys() == set()


@pytest.mark.parametrize("granularity", list(RecoveryGranularity))
def test_restart_leaves_groups_without_interrupted_attempts_alone(
    harness: Harness, granularity: RecoveryGranularity
) -> None:
    waiting_retry = harness.reserve(2, granularity=granularity)
    harness.dispatch(waiting_retry)
    harness.seal(waiting_retry, 0)
    harness.fail(waiting_retry, 1)
    ready = harness.ready_group(2, granularity=granularity)
    unknown = harness.ready_group(2, granularity=granularity)
    harness.call("mark_finalization_started", unknown)
    harness.call("mark_finalization_unknown", unknown)
    before = {group_id: harness.group(group_id) for group_id in (waiting_retry, ready, unknown)}
    harness.call("prepare_for_restart")
    for group_id, record in before.items():
        assert harness.group(group_id) == record


def test_restart_moves_finalizing_groups_to_finalization_unknown(harness: Harness) -> None:
    group_id = harness.ready_group(2)
    harness.call("mark_finalization_started", group_id)
    with pytest.raises(
        CheckpointUnsafeError, match=f"1 group\\(s\\) are 'finalizing'.*'{group_id}'"
    ):
        harness.ledger.assert_checkpoint_safe()
    harness.call("prepare_for_restart")
    assert harness.group(group_id).status is PromptGroupStatus.FINALIZATION_UNKNOWN
    harness.ledger.assert_checkpoint_safe()
    harness.call("mark_finalization_started", group_id)  # re-finalize on restore
    harness.call("discard_group", group_id)
    assert len(harness.ledger) == 0


def test_restart_replaces_reserved_attempts_of_unadmitted_groups(harness: Harness) -> None:
    group_id = harness.reserve(2, admitted=False)
    before = harness.group(group_id).gate_rollout_ids
    harness.call("prepare_for_restart")
    record = harness.group(group_id)
    assert current_statuses(record) == [A.RESERVED, A.RESERVED]
    assert [sibling.attempts[0].status for sibling in record.siblings] == [A.ABANDONED, A.ABANDONED]
    assert not set(before) & set(record.gate_rollout_ids), (
        "fresh UUIDs fence anything the old attempts wrote"
    )


def test_one_restart_redoes_groups_of_both_granularities_each_with_fresh_uuids(
    harness: Harness,
) -> None:
    """A restart mints its sibling groups' fresh attempts in one batch: each redone
    sibling gets its own, and a prompt_group group between them still its whole cohort."""
    first = mixed_group(harness, SIBLING)
    cohort = mixed_group(harness, PROMPT_GROUP)
    last = mixed_group(harness, SIBLING)
    before = {group_id: harness.group(group_id) for group_id in (first, cohort, last)}
    harness.call("prepare_for_restart")
    assert attempt_counts(harness, first) == attempt_counts(harness, last) == [1, 1, 2, 2]
    assert attempt_counts(harness, cohort) == [2, 2, 2, 2]
    fresh = [
        attempt
        for group_id in (first, cohort, last)
        for sibling in harness.group(group_id).siblings[:]
        for attempt in sibling.attempts[
            len(before[group_id].siblings[sibling.generation_index].attempts) :
        ]
    ]
    assert len(fresh) == 2 + 4 + 2
    assert all(attempt.status is A.RESERVED for attempt in fresh)
    old = {
        attempt.attempt_uuid
        for record in before.values()
        for sibling in record.siblings
        for attempt in sibling.attempts
    }
    uuids = {attempt.attempt_uuid for attempt in fresh}
    assert len(uuids) == len(fresh) and not uuids & old


def test_assert_checkpoint_safe_names_every_finalizing_group(harness: Harness) -> None:
    ids = [harness.ready_group(1) for _ in range(10)]
    for group_id in ids:
        harness.call("mark_finalization_started", group_id)
    with pytest.raises(CheckpointUnsafeError) as raised:
        harness.ledger.assert_checkpoint_safe()
    message = str(raised.value)
    assert message.startswith("10 group(s) are 'finalizing'")
    assert all(repr(group_id) in message for group_id in ids[:8])
    assert "and 2 more" in message


def test_expected_staging_keys_are_those_of_sealed_current_attempts(harness: Harness) -> None:
    first = harness.ready_group(2)
    second = harness.reserve(2)
    harness.dispatch(second)
    harness.seal(second, 1, keys=3)
    expected = {
        key
        for group_id, index in ((first, 0), (first, 1), (second, 1))
        for key in harness.group(group_id).siblings[index].attempts[-1].staging_keys
    }
    assert len(expected) == 2 + 3
    assert harness.ledger.expected_staging_keys() == expected
    harness.call("mark_finalization_started", first)
    harness.call("discard_group", first)
    assert harness.ledger.expected_staging_keys() == set(
        harness.group(second).siblings[1].attempts[-1].staging_keys
    )


def test_discard_canonical_groups_drops_listed_groups_whatever_their_status(
    harness: Harness,
) -> None:
    generating = harness.reserve(2)
    ready = harness.ready_group(2)
    kept = harness.ready_group(2)
    dropped = harness.call("discard_canonical_groups", {generating, ready, "not-here"})
    assert dropped == 2
    assert [record.group_id for record in harness.ledger.groups()] == [kept]
    assert harness.call("discard_canonical_groups", set()) == 0


@pytest.mark.parametrize("bad", ["abc", 5, {1, 2}])
def test_discard_canonical_groups_rejects_non_id_collections(harness: Harness, bad: object) -> None:
    group_id = harness.reserve(1)
    with pytest.raises(InvalidLedgerInputError, match="discard_canonical_groups"):
        harness.call("discard_canonical_groups", bad)
    assert group_id in harness.ledger


def test_load_state_dict_needs_an_empty_ledger(harness: Harness) -> None:
    group_id = harness.reserve(1)
    state = harness.ledger.state_dict()
    with pytest.raises(LedgerError, match="needs an empty ledger; this one holds 1 group"):
        harness.call("load_state_dict", state)
    assert [record.group_id for record in harness.ledger.groups()] == [group_id]
