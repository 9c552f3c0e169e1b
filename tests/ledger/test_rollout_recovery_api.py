"""Every name of the reference API page is importable from rollvault.rollout_recovery."""

from __future__ import annotations

import functools
import importlib
import inspect

import pytest

import rollvault.rollout_recovery as api

SPEC_CLASSES = [
    "PromptGroupPhase",
    "RecoveryGranularity",
    "RolloutAttemptStatus",
    "PromptGroupStatus",
    "PromptRef",
    "RolloutAttemptRecord",
    "RolloutSiblingRecord",
    "PromptGroupRecoveryRecord",
    "ParsedRolloutRecoveryState",
    "SiblingSealResult",
    "RolloutRecoveryLedger",
]
SPEC_FUNCTIONS = [
    "_reject_unknown_fields",
    "_validate_prompt_identity",
    "_new_attempt",
    "_receipt_staging_keys",
    "_validate_batch_shortfall",
    "_validate_finalizer_metrics",
    "_validate_finalizer_rewards",
    "build_rollout_recovery_state",
    "parse_rollout_recovery_state",
]
SPEC_DATA = [
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "RolloutRecoveryState",
    "_LEDGER_STATE_FIELDS",
    "_SIDECAR_STATE_FIELDS",
    "_GROUP_STATE_FIELDS",
    "_PROMPT_REF_STATE_FIELDS",
    "_SIBLING_STATE_FIELDS",
    "_ATTEMPT_STATE_FIELDS",
]
REFERENCED_TYPES = [
    "DataPlaneMutationCut",
    "DatumSpec",
    "RewardChecks",
    "RewardLogContext",
    "FinalizedReward",
    "CaptureRewardSettings",
]
LEDGER_METHODS = {
    "groups": [],
    "reserve_group": [
        "cut",
        "prompt_id",
        "prompt_payload",
        "expected_generations",
        "target_step",
        "start_weight_version",
        "task_source",
        "recovery_granularity",
        "admitted",
        "group_id",
        "admission_id",
        "prompt_ref",
    ],
    "mark_group_admitted": ["cut", "group_id", "target_step", "start_weight_version"],
    "bind_runtime_prompt": ["cut", "group_id", "prompt_payload"],
    "prepare_for_restart": ["cut"],
    "_abandon_entire_group": ["record"],
    "assert_checkpoint_safe": [],
    "expected_staging_keys": [],
    "prepare_incomplete_retry": ["cut", "group_id"],
    "mark_group_dispatched": ["cut", "group_id", "generation_indices"],
    "mark_sibling_sealed": [
        "cut",
        "group_id",
        "generation_index",
        "gate_rollout_id",
        "receipt",
        "reward",
        "mask_sample",
        "reward_checks",
        "reward_log_context",
    ],
    "mark_group_sealed": ["cut", "group_id", "results"],
    "abandon_unsealed": ["cut", "group_id"],
    "finalization_inputs": ["group_id"],
    "mark_finalization_started": ["cut", "group_id"],
    "mark_finalization_unknown": ["cut", "group_id"],
    "discard_group": ["cut", "group_id"],
    "discard_canonical_groups": ["cut", "group_ids"],
    "get_group": ["group_id"],
    "state_dict": [],
    "from_state_dict": ["state"],
    "load_state_dict": ["cut", "state"],
    "_group_from_state": ["raw_group", "seen_attempt_uuids", "where"],
    "_require_group": ["group_id"],
    "_copy_group": ["record"],
    "_require_sibling": ["record", "generation_index"],
    "_require_group_status": ["record", "allowed", "transition"],
}


@pytest.mark.parametrize("name", SPEC_CLASSES + SPEC_FUNCTIONS + SPEC_DATA + REFERENCED_TYPES)
def test_spec_name_is_importable(name: str) -> None:
    module = importlib.import_module("rollvault.rollout_recovery")
    assert getattr(module, name) is not None


def test_all_lists_public_names_that_exist() -> None:
    for name in api.__all__:
        assert hasattr(api, name), name
    public = [
        name for name in SPEC_CLASSES + SPEC_FUNCTIONS + SPEC_DATA if not name.startswith("_")
    ]
    assert set(public) <= set(api.__all__)
    assert not [name for name in api.__all__ if name.startswith("_")]


@pytest.mark.parametrize("method", sorted(LEDGER_METHODS))
def test_ledger_method_signatures_follow_the_spec(method: str) -> None:
    function = inspect.getattr_static(api.RolloutRecoveryLedger, method)
    function = getattr(function, "__func__", function)
    parameters = [
        name for name in inspect.signature(function).parameters if name not in ("self", "cls")
    ]
    assert parameters == LEDGER_METHODS[method]


def test_record_fields_follow_the_spec() -> None:
    assert api.RolloutAttemptRecord.__struct_fields__[:8] == (
        "attempt_uuid",
        "status",
        "receipt",
        "reward",
        "mask_sample",
        "reward_checks",
        "reward_log_context",
        "staging_keys",
    )
    assert api.PromptGroupRecoveryRecord.__struct_fields__ == (
        "group_id",
        "admission_id",
        "prompt_id",
        "prompt_ref",
        "task_source",
        "recovery_granularity",
        "runtime_prompt_payload",
        "expected_generations",
        "target_step",
        "start_weight_version",
        "siblings",
        "phase",
        "status",
    )
    assert api.SiblingSealResult.__struct_fields__ == (
        "gate_rollout_id",
        "receipt",
        "reward",
        "mask_sample",
        "reward_checks",
        "reward_log_context",
    )
    # The spec's ledger_state is built from the typed state when first read (restore never
    # reads it): a cached property beside the fields, the rest of the spec's attributes fields.
    assert isinstance(
        inspect.getattr_static(api.ParsedRolloutRecoveryState, "ledger_state"),
        functools.cached_property,
    )
    assert api.ParsedRolloutRecoveryState.__struct_fields__ == (
        "checked_ledger",
        "batch_shortfall",
        "sampler_stamps_target_steps",
        "finalizer_metrics_by_group",
        "finalizer_rewards_by_group",
        "reward_settings",
        # rollvault's: a ledger read from ledger segments, as the checked records a
        # restore loads (then checked_ledger is None; ledger_state is built from it).
        "checked_groups",
    )
    assert api.PromptRef.__struct_fields__ == ("sample_id", "task_name")


def test_enum_values_follow_the_spec() -> None:
    assert [member.value for member in api.PromptGroupPhase] == ["reserved", "admitted"]
    assert [member.value for member in api.RecoveryGranularity] == ["sibling", "prompt_group"]
    assert [member.value for member in api.RolloutAttemptStatus] == [
        "reserved",
        "dispatched",
        "sealed",
        "failed",
        "abandoned",
    ]
    assert [member.value for member in api.PromptGroupStatus] == [
        "generating",
        "ready_to_finalize",
        "finalizing",
        "finalization_unknown",
    ]
