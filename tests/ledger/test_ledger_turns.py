"""Turn progress of multi-turn attempts: commit_turn, its fencing, and the prefix a restart keeps."""

from __future__ import annotations

import pytest
from ledger_testkit import Harness

from rollvault.ledger.errors import StaleAttemptError
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION
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
