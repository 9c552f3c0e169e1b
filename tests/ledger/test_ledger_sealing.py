"""Sealing: receipt validation, fencing, idempotent repeats, atomic cohorts, finalization inputs."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from ledger_testkit import Harness, current_statuses, receipt_for

from rollvault.rollout_recovery import (
    InvalidLedgerInputError,
    InvalidReceiptError,
    LedgerTransitionError,
    PromptGroupStatus,
    RewardChecks,
    RewardLogContext,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    SealConflictError,
    SiblingSealResult,
    StaleAttemptError,
    _receipt_staging_keys,
)

CHECKS = RewardChecks(overlong=False, format_ok=True, finite_logprobs=True)
CONTEXT = RewardLogContext(response_length=42, stop_reason="stop")


def seal_call(harness: Harness, group_id: str, index: int, **overrides: Any) -> None:
    gate = harness.gate_id(group_id, index)
    kwargs: dict[str, Any] = {
        "generation_index": index,
        "gate_rollout_id": gate,
        "receipt": receipt_for(gate, 2),
        "reward": 0.5,
        "mask_sample": False,
        "reward_checks": CHECKS,
        "reward_log_context": CONTEXT,
    }
    kwargs.update(overrides)
    harness.call("mark_sibling_sealed", group_id, **kwargs)


@pytest.fixture
def dispatched(harness: Harness) -> str:
    group_id = harness.reserve(2, group_id="grp")
    harness.dispatch(group_id)
    return group_id


def test_seal_records_the_result(harness: Harness, dispatched: str) -> None:
    gate = harness.gate_id(dispatched, 1)
    receipt = receipt_for(
        gate,
        2,
        row_digests=[{"length": 3, "digest": "ab"}, {"length": 0, "digest": "cd"}],
        reward=1,
    )
    seal_call(harness, dispatched, 1, receipt=receipt, reward=1)
    attempt = harness.group(dispatched).siblings[1].attempts[-1]
    assert attempt.status is RolloutAttemptStatus.SEALED
    assert attempt.receipt == receipt
    assert attempt.staging_keys == [f"{gate}/call0", f"{gate}/call1"]
    assert attempt.reward == 1.0 and isinstance(attempt.reward, float)
    assert (attempt.mask_sample, attempt.reward_checks, attempt.reward_log_context) == (
        False,
        CHECKS,
        CONTEXT,
    )
    assert harness.group(dispatched).sealed_generation_indices == [1]
    assert harness.ledger.expected_staging_keys() == set(attempt.staging_keys)


def test_the_weight_version_in_a_receipt_is_kept_and_optional(
    harness: Harness, dispatched: str
) -> None:
    with_version = receipt_for(harness.gate_id(dispatched, 0), 2, weight_version=3)
    seal_call(harness, dispatched, 0, receipt=with_version)
    # A receipt of an older version, without the field, still seals and loads.
    without = receipt_for(harness.gate_id(dispatched, 1), 2)
    seal_call(harness, dispatched, 1, receipt=without)
    restored = RolloutRecoveryLedger.from_state_dict(harness.ledger.state_dict())
    siblings = restored.get_group(dispatched).siblings
    assert siblings[0].attempts[-1].receipt == with_version
    assert siblings[1].attempts[-1].receipt == without


def test_the_ledger_keeps_its_own_copy_of_the_receipt(harness: Harness, dispatched: str) -> None:
    gate = harness.gate_id(dispatched, 0)
    receipt = receipt_for(gate, 1)
    seal_call(harness, dispatched, 0, receipt=receipt)
    receipt["staging_keys"].append("forged")
    receipt["gate_rollout_id"] = "forged"
    attempt = harness.group(dispatched).siblings[0].attempts[-1]
    assert attempt.receipt == receipt_for(gate, 1)
    assert "forged" not in harness.ledger.expected_staging_keys()


@pytest.mark.parametrize(
    ("make_receipt", "message"),
    [
        (lambda gate: None, "needs a Gate receipt, got None"),
        (lambda gate: [gate], "must be a dict, got list"),
        (lambda gate: {"staging_keys": ["k"]}, "missing required field `gate_rollout_id`"),
        (lambda gate: {"gate_rollout_id": gate}, "missing required field `staging_keys`"),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": []},
            "length >= 1 - at `$.staging_keys`",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": "k"},
            "Expected `array`, got `str` - at `$.staging_keys`",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k", 3]},
            "Expected `str`, got `int` - at `$.staging_keys[1]`",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k", ""]},
            "at `$.staging_keys[1]`",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k", "k"]},
            "lists 'k' more than once",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k"], "extra": 1},
            "unknown field `extra`",
        ),
        (
            lambda gate: {
                "gate_rollout_id": gate,
                "staging_keys": ["k"],
                "row_digests": [{"length": -1, "digest": "d"}],
            },
            "at `$.row_digests[0].length`",
        ),
        (
            lambda gate: {
                "gate_rollout_id": gate,
                "staging_keys": ["k", "j"],
                "row_digests": [{"length": 1, "digest": "d"}],
            },
            "row_digests has 1 entries for 2 staging_keys",
        ),
        (
            lambda gate: {"gate_rollout_id": gate + "x", "staging_keys": ["k"]},
            "is not the attempt's gate rollout id",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k"], "reward": 0.25},
            "receipt reward 0.25 differs from reward 0.5",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k"], "weight_version": -1},
            "at `$.weight_version`",
        ),
        (
            lambda gate: {"gate_rollout_id": gate, "staging_keys": ["k"], "weight_version": "3"},
            "at `$.weight_version`",
        ),
    ],
)
def test_invalid_receipts_are_refused_and_change_nothing(
    harness: Harness, dispatched: str, make_receipt: Any, message: str
) -> None:
    gate = harness.gate_id(dispatched, 0)
    attempt_hex = harness.group(dispatched).siblings[0].attempts[-1].attempt_uuid.hex
    before = harness.ledger.state_dict()
    with pytest.raises(InvalidReceiptError, match=re.escape(message)) as raised:
        seal_call(harness, dispatched, 0, receipt=make_receipt(gate))
    assert f"group 'grp' sibling 0 attempt {attempt_hex}" in str(raised.value)
    assert harness.ledger.state_dict() == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reward": math.nan}, "reward must be a finite number"),
        ({"reward": math.inf}, "reward must be a finite number"),
        ({"reward": "1"}, "reward must be a finite number"),
        ({"reward": True}, "reward must be a finite number"),
        ({"mask_sample": 0}, "mask_sample must be a bool"),
        ({"reward_checks": {"overlong": False}}, "reward_checks must be RewardChecks or None"),
        ({"reward_log_context": "ctx"}, "reward_log_context must be RewardLogContext or None"),
        ({"generation_index": 2}, "generation_index 2 is not a sibling index"),
        ({"generation_index": True}, "generation_index True is not a sibling index"),
    ],
)
def test_invalid_seal_arguments_are_refused(
    harness: Harness, dispatched: str, overrides: dict[str, Any], message: str
) -> None:
    before = harness.ledger.state_dict()
    gate = harness.gate_id(dispatched, 0)
    overrides.setdefault("gate_rollout_id", gate)
    with pytest.raises(InvalidLedgerInputError, match=re.escape(message)):
        seal_call(harness, dispatched, 0, **overrides)
    assert harness.ledger.state_dict() == before


def test_a_result_from_a_superseded_attempt_is_fenced_off(
    harness: Harness, dispatched: str
) -> None:
    old_gate = harness.gate_id(dispatched, 0)
    harness.fail(dispatched, 0)
    harness.call("prepare_incomplete_retry", dispatched)
    harness.dispatch(dispatched)
    new_gate = harness.gate_id(dispatched, 0)
    assert new_gate != old_gate
    before = harness.ledger.state_dict()
    with pytest.raises(
        StaleAttemptError,
        match=re.escape(f"gate rollout id {old_gate!r} is not the current attempt's {new_gate!r}"),
    ):
        seal_call(harness, dispatched, 0, gate_rollout_id=old_gate, receipt=receipt_for(old_gate))
    with pytest.raises(StaleAttemptError, match="superseded attempt is refused"):
        harness.call(
            "mark_sibling_failed",
            dispatched,
            generation_index=0,
            gate_rollout_id=old_gate,
            reason="late",
        )
    with pytest.raises(StaleAttemptError):
        seal_call(harness, dispatched, 0, gate_rollout_id=harness.gate_id(dispatched, 1))
    assert harness.ledger.state_dict() == before
    seal_call(harness, dispatched, 0)
    assert current_statuses(harness.group(dispatched))[0] is RolloutAttemptStatus.SEALED


def test_an_identical_repeated_seal_is_a_no_op(harness: Harness, dispatched: str) -> None:
    seal_call(harness, dispatched, 0)
    seal_call(harness, dispatched, 1)
    after_first = harness.ledger.state_dict()
    seal_call(harness, dispatched, 1)
    assert harness.ledger.state_dict() == after_first
    harness.call("mark_finalization_started", dispatched)
    seal_call(harness, dispatched, 0)  # still a no-op once finalizing
    assert harness.group(dispatched).status is PromptGroupStatus.FINALIZING


@pytest.mark.parametrize(
    ("overrides", "differing"),
    [
        ({"reward": 0.75}, "reward"),
        ({"mask_sample": True}, "mask_sample"),
        ({"reward_checks": None}, "reward_checks"),
        (
            {"reward_log_context": RewardLogContext(response_length=1, stop_reason="length")},
            "reward_log_context",
        ),
    ],
)
def test_a_different_repeated_seal_is_an_error(
    harness: Harness, dispatched: str, overrides: dict[str, Any], differing: str
) -> None:
    seal_call(harness, dispatched, 0)
    before = harness.ledger.state_dict()
    with pytest.raises(SealConflictError, match=f"already sealed with a different {differing}"):
        seal_call(harness, dispatched, 0, **overrides)
    assert harness.ledger.state_dict() == before


def test_a_repeated_seal_with_other_keys_is_an_error(harness: Harness, dispatched: str) -> None:
    seal_call(harness, dispatched, 0)
    gate = harness.gate_id(dispatched, 0)
    with pytest.raises(SealConflictError, match="receipt, staging_keys"):
        seal_call(harness, dispatched, 0, receipt=receipt_for(gate, 1))


def test_failure_needs_a_reason_and_records_it(harness: Harness, dispatched: str) -> None:
    gate = harness.gate_id(dispatched, 0)
    with pytest.raises(InvalidLedgerInputError, match="reason must be a non-empty str"):
        harness.call(
            "mark_sibling_failed", dispatched, generation_index=0, gate_rollout_id=gate, reason=""
        )
    harness.call(
        "mark_sibling_failed",
        dispatched,
        generation_index=0,
        gate_rollout_id=gate,
        reason="CUDA OOM",
    )
    attempt = harness.group(dispatched).siblings[0].attempts[-1]
    assert (attempt.status, attempt.failure_reason) == (RolloutAttemptStatus.FAILED, "CUDA OOM")


def cohort(harness: Harness, group_id: str, *, reward: float = 1.0) -> dict[int, SiblingSealResult]:
    record = harness.group(group_id)
    return {
        index: SiblingSealResult(
            gate_rollout_id=record.gate_rollout_id(index),
            receipt=receipt_for(record.gate_rollout_id(index)),
            reward=reward + index,
            mask_sample=index == 1,
            reward_checks=CHECKS,
        )
        for index in range(len(record.siblings))
    }


def test_mark_group_sealed_seals_the_whole_cohort(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.call("mark_group_sealed", group_id, cohort(harness, group_id))
    record = harness.group(group_id)
    assert record.status is PromptGroupStatus.READY_TO_FINALIZE
    assert [sibling.attempts[-1].reward for sibling in record.siblings] == [1.0, 2.0, 3.0]
    assert [sibling.attempts[-1].mask_sample for sibling in record.siblings] == [False, True, False]
    harness.call("mark_group_sealed", group_id, cohort(harness, group_id))  # identical: no-op
    with pytest.raises(SealConflictError):
        harness.call("mark_group_sealed", group_id, cohort(harness, group_id, reward=5.0))


def test_mark_group_sealed_is_atomic(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    results = cohort(harness, group_id)
    bad_gate = results[2].gate_rollout_id
    results[2] = SiblingSealResult(
        gate_rollout_id=bad_gate,
        receipt={"gate_rollout_id": bad_gate, "staging_keys": []},
        reward=0.0,
        mask_sample=False,
    )
    before = harness.ledger.state_dict()
    with pytest.raises(InvalidReceiptError, match="sibling 2"):
        harness.call("mark_group_sealed", group_id, results)
    assert harness.ledger.state_dict() == before, "siblings 0 and 1 were not sealed"


def test_mark_group_sealed_refuses_a_cohort_with_a_live_failure(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    results = cohort(harness, group_id)
    harness.fail(group_id, 1)
    before = harness.ledger.state_dict()
    with pytest.raises(
        LedgerTransitionError,
        match="sibling 1 attempt .* cannot seal an attempt in status 'failed'",
    ):
        harness.call("mark_group_sealed", group_id, results)
    assert harness.ledger.state_dict() == before


@pytest.mark.parametrize(
    ("keys", "message"),
    [({0, 1}, r"missing \[2\]"), ({0, 1, 2, 3}, r"unexpected \['3'\]|unexpected \[3\]")],
)
def test_mark_group_sealed_needs_exactly_one_result_per_sibling(
    harness: Harness, keys: set[int], message: str
) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    full = cohort(harness, group_id)
    results = {key: full.get(key, full[0]) for key in keys}
    with pytest.raises(InvalidLedgerInputError, match=message):
        harness.call("mark_group_sealed", group_id, results)


def test_mark_group_sealed_rejects_non_results(harness: Harness) -> None:
    group_id = harness.reserve(1)
    harness.dispatch(group_id)
    with pytest.raises(InvalidLedgerInputError, match="expected a SiblingSealResult, got dict"):
        harness.call("mark_group_sealed", group_id, {0: {"gate_rollout_id": "x"}})
    with pytest.raises(InvalidLedgerInputError, match="results must be a dict"):
        harness.call("mark_group_sealed", group_id, [])


def test_finalization_inputs_are_in_sibling_order(harness: Harness) -> None:
    group_id = harness.reserve(3, group_id="fin")
    harness.dispatch(group_id)
    for index in (2, 0, 1):
        seal_call(harness, group_id, index, reward=float(index), mask_sample=index == 2)
    record = harness.group(group_id)
    logical, gates, receipts, rewards, masks, checks, contexts = harness.ledger.finalization_inputs(
        group_id
    )
    assert logical == ["fin_g0", "fin_g1", "fin_g2"]
    assert gates == record.gate_rollout_ids
    assert [receipt["gate_rollout_id"] for receipt in receipts if receipt] == gates
    assert rewards == [0.0, 1.0, 2.0]
    assert masks == [False, False, True]
    assert checks == [CHECKS] * 3 and contexts == [CONTEXT] * 3
    assert receipts[0] is not None
    receipts[0]["staging_keys"].clear()
    assert harness.ledger.finalization_inputs(group_id)[2][0] == receipts_before(record, 0)


def receipts_before(record: Any, index: int) -> Any:
    return record.siblings[index].attempts[-1].receipt


def test_receipt_staging_keys_returns_a_fresh_ordered_copy() -> None:
    receipt = {"gate_rollout_id": "g_g0_a1", "staging_keys": ["b", "a", "c"]}
    keys = _receipt_staging_keys(receipt)
    assert keys == ["b", "a", "c"]
    keys.append("d")
    assert receipt["staging_keys"] == ["b", "a", "c"]
    with pytest.raises(InvalidReceiptError, match="more than once"):
        _receipt_staging_keys({"gate_rollout_id": "g", "staging_keys": ["a", "a"]})
