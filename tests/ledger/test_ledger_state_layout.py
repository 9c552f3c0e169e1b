"""The persisted structs' field order and encoded bytes, pinned.

A msgspec Struct's field order is the key order of its encoded and builtins
forms (``state_dict``, sidecars written unsorted by an older build, ledger
segment headers). A refactor of the schema classes (shared bases, derived
fields) must leave both exactly as they were.
"""

from __future__ import annotations

import uuid

import msgspec

from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.state_convert import group_header_to_state, group_to_state
from rollvault.ledger.state_schema import (
    AttemptState,
    GroupHeaderState,
    GroupState,
    PromptRefState,
    SiblingState,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

_HEADER_FIELDS = (
    "group_id",
    "admission_id",
    "prompt_id",
    "prompt_ref",
    "task_source",
    "recovery_granularity",
    "expected_generations",
    "target_step",
    "start_weight_version",
)


def test_field_order_of_the_persisted_structs() -> None:
    assert GroupState.__struct_fields__ == (*_HEADER_FIELDS, "siblings", "phase", "status")
    assert GroupHeaderState.__struct_fields__ == (*_HEADER_FIELDS, "phase", "status")
    assert SiblingState.__struct_fields__ == ("generation_index", "attempts")
    assert PromptRefState.__struct_fields__ == ("sample_id", "task_name")
    assert AttemptState.__struct_fields__ == (
        "attempt_uuid",
        "status",
        "receipt",
        "reward",
        "mask_sample",
        "reward_checks",
        "reward_log_context",
        "staging_keys",
        "failure_reason",
        "failure_kind",
        "turn_keys",
        "env_state_revision",
    )


def test_header_types_are_the_groups() -> None:
    group = {field.name: field for field in msgspec.structs.fields(GroupState)}
    for field in msgspec.structs.fields(GroupHeaderState):
        assert field == group[field.name]


def _record() -> PromptGroupRecoveryRecord:
    attempt = RolloutAttemptRecord(
        attempt_uuid=uuid.UUID(int=1),
        status=RolloutAttemptStatus.FAILED,
        failure_reason="data: bad",
        failure_kind=AttemptFailureKind.DATA,
    )
    return PromptGroupRecoveryRecord(
        group_id="g1",
        admission_id="a1",
        prompt_id="p1",
        prompt_ref=PromptRef(sample_id="7", task_name="math"),
        task_source="gsm8k",
        recovery_granularity=RecoveryGranularity.SIBLING,
        expected_generations=2,
        target_step=3,
        start_weight_version=1,
        siblings=[RolloutSiblingRecord(generation_index=0, attempts=[attempt])],
        phase=PromptGroupPhase.ADMITTED,
        status=PromptGroupStatus.GENERATING,
    )


_HEADER_BYTES = (
    b'{"group_id":"g1","admission_id":"a1","prompt_id":"p1",'
    b'"prompt_ref":{"sample_id":"7","task_name":"math"},"task_source":"gsm8k",'
    b'"recovery_granularity":"sibling","expected_generations":2,"target_step":3,'
    b'"start_weight_version":1'
)
_SIBLINGS_BYTES = (
    b'"siblings":[{"generation_index":0,"attempts":[{'
    b'"attempt_uuid":"00000000000000000000000000000001","status":"failed",'
    b'"receipt":null,"reward":null,"mask_sample":null,"reward_checks":null,'
    b'"reward_log_context":null,"staging_keys":[],"failure_reason":"data: bad",'
    b'"failure_kind":"data","turn_keys":[],"env_state_revision":0}]}]'
)
_TAIL_BYTES = b'"phase":"admitted","status":"generating"}'


def test_encoded_bytes_of_a_group_and_its_header() -> None:
    record = _record()
    assert msgspec.json.encode(group_to_state(record)) == b",".join(
        [_HEADER_BYTES, _SIBLINGS_BYTES, _TAIL_BYTES]
    )
    assert msgspec.json.encode(group_header_to_state(record)) == b",".join(
        [_HEADER_BYTES, _TAIL_BYTES]
    )
