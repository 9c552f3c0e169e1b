"""Turn progress of multi-turn attempts: commit_turn, its fencing, and the prefix a restart keeps."""

from __future__ import annotations

import uuid

import pytest
from ledger_testkit import Harness

from rollvault.ledger.errors import StaleAttemptError
from rollvault.ledger.records import InterruptedAttempt
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION
from rollvault.ledger.statuses import AttemptFailureKind
from rollvault.rollout_recovery import (
    InvalidLedgerInputError,
    LedgerTransitionError,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)


def commit(h: Harness, group_id: str, index: int, turn: int, gate: str | None = None) -> int:
    gate = gate or h.gate_id(group_id, index)
    revision: int = h.call(
        "commit_turn",
        group_id,
        generation_index=index,
        gate_rollout_id=gate,
        staging_key=f"{gate}/call{turn}",
        turn_index=turn,
    )
    return revision


def test_turns_commit_in_order_on_a_dispatched_attempt(harness: Harness) -> None:
    group_id = harness.reserve(2)
    with pytest.raises(LedgerTransitionError, match="only a dispatched attempt commits turns"):
        commit(harness, group_id, 0, 0)
    harness.dispatch(group_id)
    assert [commit(harness, group_id, 0, turn) for turn in range(3)] == [1, 2, 3]
    with pytest.raises(InvalidLedgerInputError, match="turn 5 committed after 3 turns"):
        commit(harness, group_id, 0, 5)
    attempt = harness.group(group_id).siblings[0].current_attempt
    gate = harness.gate_id(group_id, 0)
    assert attempt.turn_keys == [f"{gate}/call{t}" for t in range(3)]
    assert attempt.env_state_revision == 3
    # The live attempt owns its committed turns' rows.
    assert set(attempt.turn_keys) <= harness.ledger.expected_staging_keys()
    # Its seal must list them first.
    with pytest.raises(InvalidLedgerInputError, match="do not start with the attempt's committed"):
        harness.call(
            "mark_sibling_sealed",
            group_id,
            generation_index=0,
            gate_rollout_id=gate,
            receipt={"gate_rollout_id": gate, "staging_keys": ["other"]},
            reward=1.0,
            mask_sample=False,
        )
    harness.seal(group_id, 0, keys=3)
    assert harness.group(group_id).siblings[0].current_attempt.status is RolloutAttemptStatus.SEALED


def test_a_restart_keeps_the_committed_prefix_and_fences_the_old_attempt(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    old = harness.gate_id(group_id, 0)
    commit(harness, group_id, 0, 0)
    commit(harness, group_id, 0, 1)
    harness.seal(group_id, 1)
    state = harness.ledger.state_dict()
    assert state["schema_version"] == ROLLOUT_RECOVERY_SCHEMA_VERSION == 5
    restored = RolloutRecoveryLedger.from_state_dict(state)
    harness.ledger = restored
    harness.call("prepare_for_restart")
    fresh = harness.group(group_id).siblings[0].current_attempt
    assert fresh.status is RolloutAttemptStatus.RESERVED
    assert fresh.turn_keys == [f"{old}/call0", f"{old}/call1"] and fresh.env_state_revision == 2
    harness.dispatch(group_id)
    # The superseded attempt can never commit again; the fresh one continues at turn 2.
    with pytest.raises(StaleAttemptError, match="superseded attempt is refused"):
        commit(harness, group_id, 0, 2, gate=old)
    assert commit(harness, group_id, 0, 2) == 3


def _interrupted(index: int, attempt_uuid: uuid.UUID) -> InterruptedAttempt:
    return InterruptedAttempt(
        generation_index=index, attempt_uuid=attempt_uuid, reason="interrupted: test"
    )


@pytest.mark.parametrize("journaled", [["later"], ["current", "later"]])
def test_a_second_restart_from_the_same_snapshot_keeps_the_committed_prefix(
    harness: Harness, journaled: list[str]
) -> None:
    # Start 1 committed two turns and a snapshot holds them; start 2 restored it, continued
    # the episode in a fresh attempt ("later", dispatched: in the journal) and died before
    # a snapshot. Start 3 restores the same snapshot: the journal shows "later" in flight
    # (and the snapshot's own attempt too, when it was dispatched after the snapshot).
    # The restart must continue at turn 2 again, not begin over at turn 0 (it did, and
    # the chaos check caught it: 'start 2 continued ... but it trained as ...').
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    old = harness.gate_id(group_id, 0)
    commit(harness, group_id, 0, 0)
    commit(harness, group_id, 0, 1)
    current = harness.group(group_id).siblings[0].current_attempt.attempt_uuid
    uuids = {"current": current, "later": uuid.uuid4()}
    harness.call(
        "mark_attempts_interrupted", group_id, [_interrupted(0, uuids[n]) for n in journaled]
    )
    harness.call("prepare_for_restart")
    attempts = harness.group(group_id).siblings[0].attempts
    assert attempts[-2].attempt_uuid == uuids["later"]
    assert attempts[-2].failure_kind is AttemptFailureKind.INTERRUPTED
    fresh = attempts[-1]
    assert fresh.status is RolloutAttemptStatus.RESERVED
    assert fresh.turn_keys == [f"{old}/call0", f"{old}/call1"] and fresh.env_state_revision == 2
    RolloutRecoveryLedger.from_state_dict(harness.ledger.state_dict())  # a state it accepts


def test_an_attempt_failed_by_the_snapshot_hands_no_prefix_to_one_interrupted_after(
    harness: Harness,
) -> None:
    # The snapshot's attempt had failed (its episode broke): the retry minted after the
    # snapshot began at turn 0, so the restart after its interruption begins there too.
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    commit(harness, group_id, 0, 0)
    harness.fail(group_id, 0)
    harness.call("mark_attempt_interrupted", group_id, _interrupted(0, uuid.uuid4()))
    harness.call("prepare_for_restart")
    fresh = harness.group(group_id).siblings[0].current_attempt
    assert fresh.status is RolloutAttemptStatus.RESERVED
    assert fresh.turn_keys == [] and fresh.env_state_revision == 0


def test_prompt_group_restarts_redo_the_group_without_a_prefix(harness: Harness) -> None:
    group_id = harness.reserve(2, granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.dispatch(group_id)
    commit(harness, group_id, 0, 0)
    harness.call("prepare_for_restart")
    assert all(not s.current_attempt.turn_keys for s in harness.group(group_id).siblings)


def test_restart_episode_drops_the_prefix_of_a_reserved_attempt(harness: Harness) -> None:
    group_id = harness.reserve(1)
    harness.dispatch(group_id)
    gate = harness.gate_id(group_id, 0)
    commit(harness, group_id, 0, 0)
    with pytest.raises(LedgerTransitionError, match="only a reserved attempt restarts"):
        harness.call("restart_episode", group_id, generation_index=0)
    harness.call("prepare_for_restart")
    assert harness.call("restart_episode", group_id, generation_index=0) == [f"{gate}/call0"]
    attempt = harness.group(group_id).siblings[0].current_attempt
    assert attempt.turn_keys == [] and attempt.env_state_revision == 0
    assert f"{gate}/call0" not in harness.ledger.expected_staging_keys()
