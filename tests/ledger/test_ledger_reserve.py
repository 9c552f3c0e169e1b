"""Reservation, admission, prompt identity and the derived ids of a group."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from ledger_testkit import Harness, payload

from rollvault.rollout_recovery import (
    DuplicateGroupError,
    InvalidLedgerInputError,
    LedgerTransitionError,
    PromptGroupPhase,
    PromptGroupStatus,
    PromptIdentityError,
    PromptPayloadUnboundError,
    PromptRef,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
    UnknownGroupError,
    _new_attempt,
    _validate_prompt_identity,
)


def reserve_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "prompt_id": "7",
        "prompt_payload": payload(7),
        "expected_generations": 4,
        "target_step": 3,
        "start_weight_version": 1,
    }
    kwargs.update(overrides)
    return kwargs


def test_reserve_creates_n_siblings_with_one_reserved_attempt_each(harness: Harness) -> None:
    record = harness.call("reserve_group", **reserve_kwargs(task_source="gsm8k"))
    assert record.status is PromptGroupStatus.GENERATING
    assert record.phase is PromptGroupPhase.ADMITTED
    assert record.recovery_granularity is RecoveryGranularity.SIBLING
    assert [sibling.generation_index for sibling in record.siblings] == [0, 1, 2, 3]
    assert all(len(sibling.attempts) == 1 for sibling in record.siblings)
    attempts = [sibling.attempts[0] for sibling in record.siblings]
    assert {attempt.status for attempt in attempts} == {RolloutAttemptStatus.RESERVED}
    assert len({attempt.attempt_uuid for attempt in attempts}) == 4
    assert all(attempt.attempt_uuid.version == 4 for attempt in attempts)
    assert (record.target_step, record.start_weight_version, record.task_source) == (3, 1, "gsm8k")
    assert record.expected_generations == 4
    assert record.sealed_generation_indices == []
    assert harness.ledger.get_group(record.group_id) == record
    assert len(harness.ledger) == 1 and record.group_id in harness.ledger


def test_reserve_defaults_ids_and_prompt_ref(harness: Harness) -> None:
    first = harness.call("reserve_group", **reserve_kwargs())
    second = harness.call(
        "reserve_group", **reserve_kwargs(prompt_id="8", prompt_payload=payload(8))
    )
    for record in (first, second):
        assert re.fullmatch("[0-9a-f]{32}", record.group_id)
        assert re.fullmatch("[0-9a-f]{32}", record.admission_id)
    assert first.group_id != second.group_id and first.admission_id != second.admission_id
    assert first.prompt_ref == PromptRef(sample_id="7", task_name="math")
    assert first.runtime_prompt_payload == payload(7)


def test_reserve_keeps_explicit_ids_and_granularity(harness: Harness) -> None:
    record = harness.call(
        "reserve_group",
        **reserve_kwargs(
            group_id="g-1",
            admission_id="adm-1",
            recovery_granularity=RecoveryGranularity.PROMPT_GROUP,
            admitted=False,
            prompt_ref=PromptRef(sample_id="7", task_name="math"),
        ),
    )
    assert (record.group_id, record.admission_id) == ("g-1", "adm-1")
    assert record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
    assert record.phase is PromptGroupPhase.RESERVED


def test_derived_ids(harness: Harness) -> None:
    record = harness.call("reserve_group", **reserve_kwargs(group_id="grp"))
    assert record.logical_rollout_ids == ["grp_g0", "grp_g1", "grp_g2", "grp_g3"]
    assert record.logical_rollout_id(2) == "grp_g2"
    attempt = record.siblings[2].attempts[-1]
    assert attempt.attempt_id == attempt.attempt_uuid.hex
    assert record.gate_rollout_id(2) == f"grp_g2_a{attempt.attempt_uuid.hex}"
    assert record.gate_rollout_ids[2] == record.gate_rollout_id(2)
    with pytest.raises(InvalidLedgerInputError, match="group 'grp': generation_index 4"):
        record.gate_rollout_id(4)
    with pytest.raises(InvalidLedgerInputError, match="generation_index -1"):
        record.logical_rollout_id(-1)


def test_a_retry_changes_the_gate_id_but_not_the_logical_id(harness: Harness) -> None:
    group_id = harness.reserve(2, group_id="grp")
    harness.dispatch(group_id)
    before = harness.group(group_id)
    harness.fail(group_id, 1)
    after = harness.call("prepare_incomplete_retry", group_id)
    assert after.logical_rollout_ids == before.logical_rollout_ids
    assert after.gate_rollout_id(0) == before.gate_rollout_id(0)
    assert after.gate_rollout_id(1) != before.gate_rollout_id(1)
    assert after.gate_rollout_id(1).startswith("grp_g1_a")


def test_duplicate_group_id_is_refused_and_keeps_the_first(harness: Harness) -> None:
    first = harness.call("reserve_group", **reserve_kwargs(group_id="dup"))
    with pytest.raises(DuplicateGroupError, match="already holds group 'dup'"):
        harness.call("reserve_group", **reserve_kwargs(group_id="dup", expected_generations=2))
    assert harness.ledger.get_group("dup") == first
    assert len(harness.ledger) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"expected_generations": 0}, "expected_generations must be an int >= 1"),
        ({"expected_generations": True}, "expected_generations must be an int >= 1"),
        ({"expected_generations": 2.0}, "expected_generations must be an int >= 1"),
        ({"target_step": -1}, "target_step must be an int >= 0"),
        ({"start_weight_version": None}, "start_weight_version must be an int >= 0"),
        ({"prompt_id": ""}, "prompt_id must be a non-empty str"),
        ({"group_id": ""}, "group_id must be a non-empty str"),
        ({"admission_id": 5}, "admission_id must be a non-empty str"),
        ({"task_source": 3}, "task_source must be a str or None"),
        ({"admitted": 1}, "admitted must be a bool"),
        ({"recovery_granularity": "cohort"}, "recovery_granularity must be one of"),
        ({"prompt_ref": {"sample_id": "7"}}, "prompt_ref must be a PromptRef"),
    ],
)
def test_reserve_rejects_bad_arguments(
    harness: Harness, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidLedgerInputError, match=re.escape(message)):
        harness.call("reserve_group", **reserve_kwargs(**overrides))
    assert len(harness.ledger) == 0


def test_reserve_accepts_a_granularity_given_by_value(harness: Harness) -> None:
    record = harness.call("reserve_group", **reserve_kwargs(recovery_granularity="prompt_group"))
    assert record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"prompt_id": "8"},
            "runtime prompt idx '7' does not resolve to the ledger's prompt_ref sample_id '8'",
        ),
        (
            {"prompt_ref": PromptRef(sample_id="7", task_name="code")},
            "runtime prompt task_name 'math' does not match the ledger's prompt_ref task_name 'code'",
        ),
        ({"prompt_payload": {"idx": "7"}}, "field 'idx' must be an int dataset index"),
        ({"prompt_payload": {"task_name": "math"}}, "field 'idx' must be an int dataset index"),
        ({"prompt_payload": {"idx": 7, "task_name": 1}}, "field 'task_name' must be a str or None"),
        ({"prompt_payload": [7]}, "prompt payload must be a mapping"),
    ],
)
def test_reserve_validates_prompt_identity_and_names_the_group(
    harness: Harness, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(PromptIdentityError, match=re.escape(message)) as raised:
        harness.call("reserve_group", **reserve_kwargs(group_id="gX", **overrides))
    assert "group 'gX'" in str(raised.value)
    assert len(harness.ledger) == 0


def test_validate_prompt_identity_directly() -> None:
    ref = PromptRef(sample_id="3", task_name=None)
    _validate_prompt_identity(ref, {"idx": 3}, group_id="g")
    with pytest.raises(PromptIdentityError, match="group 'g'.*task_name 'math'"):
        _validate_prompt_identity(ref, {"idx": 3, "task_name": "math"}, group_id="g")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_id": ""}, "sample_id must be a non-empty str"),
        ({"sample_id": 3}, "sample_id must be a non-empty str"),
        ({"sample_id": "3", "task_name": 4}, "task_name must be a str or None"),
    ],
)
def test_prompt_ref_validates_its_fields(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidLedgerInputError, match=message):
        PromptRef(**kwargs)


def test_mark_group_admitted_moves_reserved_to_admitted_once(harness: Harness) -> None:
    group_id = harness.reserve(2, admitted=False)
    before = harness.group(group_id)
    harness.call("mark_group_admitted", group_id, target_step=9, start_weight_version=5)
    after = harness.group(group_id)
    assert after.phase is PromptGroupPhase.ADMITTED
    assert (after.target_step, after.start_weight_version) == (9, 5)
    assert after.siblings == before.siblings, "admission keeps the sibling lineage"
    with pytest.raises(
        LedgerTransitionError, match="cannot admit a group in phase 'admitted'"
    ) as raised:
        harness.call("mark_group_admitted", group_id, target_step=10, start_weight_version=6)
    assert raised.value.group_id == group_id and raised.value.transition == "admit"
    assert harness.group(group_id) == after


def test_mark_group_admitted_rejects_bad_numbers_without_changing(harness: Harness) -> None:
    group_id = harness.reserve(2, admitted=False)
    before = harness.group(group_id)
    with pytest.raises(InvalidLedgerInputError, match="target_step"):
        harness.call("mark_group_admitted", group_id, target_step="9", start_weight_version=5)
    assert harness.group(group_id) == before


def test_unknown_group_is_named(harness: Harness) -> None:
    with pytest.raises(UnknownGroupError, match="holds no group 'nope'"):
        harness.ledger.get_group("nope")
    with pytest.raises(UnknownGroupError, match="'nope'"):
        harness.call("mark_group_dispatched", "nope")
    assert "nope" not in harness.ledger
    assert 3 not in harness.ledger


def test_prompt_payload_is_runtime_only_and_rebound_after_restore(harness: Harness) -> None:
    group_id = harness.reserve(2, idx=11)
    assert harness.group(group_id).prompt_payload == payload(11)
    state = harness.ledger.state_dict()
    assert "runtime_prompt_payload" not in state["groups"][0]
    assert "prompt text" not in repr(state) and "prompt 11" not in repr(state)

    restored = Harness()
    try:
        restored.mutate(lambda: restored.ledger.load_state_dict(restored.cut, state))
        record = restored.group(group_id)
        assert record.runtime_prompt_payload is None
        with pytest.raises(
            PromptPayloadUnboundError, match=f"group '{group_id}'.*bind_runtime_prompt"
        ):
            _ = record.prompt_payload
        with pytest.raises(PromptIdentityError, match="idx '12'"):
            restored.call("bind_runtime_prompt", group_id, payload(12))
        assert restored.group(group_id).runtime_prompt_payload is None
        restored.call("bind_runtime_prompt", group_id, payload(11))
        assert restored.group(group_id).prompt_payload == payload(11)
    finally:
        restored.close()


def test_records_handed_out_are_copies(harness: Harness) -> None:
    group_id = harness.ready_group(2)
    record = harness.group(group_id)
    record.status = PromptGroupStatus.GENERATING
    record.siblings[0].attempts[0].staging_keys.append("forged")
    assert record.siblings[0].attempts[0].receipt is not None
    record.siblings[0].attempts[0].receipt["staging_keys"].append("forged")
    record.siblings.pop()
    fresh = harness.group(group_id)
    assert fresh.status is PromptGroupStatus.READY_TO_FINALIZE
    assert len(fresh.siblings) == 2
    assert "forged" not in fresh.siblings[0].attempts[0].staging_keys
    assert "forged" not in harness.ledger.expected_staging_keys()
    assert [g.group_id for g in harness.ledger.groups()] == [group_id]


def test_new_attempt_is_a_fresh_reserved_uuid4() -> None:
    first, second = _new_attempt(), _new_attempt()
    assert first.status is RolloutAttemptStatus.RESERVED
    assert first.attempt_uuid != second.attempt_uuid
    assert isinstance(first.attempt_uuid, uuid.UUID) and first.attempt_uuid.version == 4
    assert (first.receipt, first.reward, first.staging_keys) == (None, None, [])


def test_a_fresh_ledger_is_empty() -> None:
    ledger = RolloutRecoveryLedger()
    assert len(ledger) == 0
    assert ledger.groups() == []
    assert ledger.expected_staging_keys() == set()
    ledger.assert_checkpoint_safe()
