"""The ledger's versioned state: exact round trip, and every rejection of from_state_dict."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ledger_testkit import Harness, receipt_for

from rollvault.rollout_recovery import (
    _ATTEMPT_STATE_FIELDS,
    _GROUP_STATE_FIELDS,
    _LEDGER_STATE_FIELDS,
    _PROMPT_REF_STATE_FIELDS,
    _SIBLING_STATE_FIELDS,
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    LedgerStateError,
    RecoveryGranularity,
    RewardChecks,
    RewardLogContext,
    RolloutRecoveryLedger,
    UnsupportedSchemaVersionError,
    _reject_unknown_fields,
)


def build_rich_ledger(harness: Harness) -> None:
    """Groups 0..3: generating (mixed lineage), ready (prompt_group), reserved phase, unknown."""
    mixed = harness.reserve(3, group_id="mixed", task_source="gsm8k")
    harness.dispatch(mixed, [0, 1])
    gate = harness.gate_id(mixed, 0)
    harness.call(
        "mark_sibling_sealed",
        mixed,
        generation_index=0,
        gate_rollout_id=gate,
        receipt=receipt_for(
            gate,
            2,
            row_digests=[{"length": 5, "digest": "aa"}, {"length": 6, "digest": "bb"}],
            reward=-1.5,
        ),
        reward=-1.5,
        mask_sample=True,
        reward_checks=RewardChecks(overlong=True, format_ok=False, finite_logprobs=True),
        reward_log_context=RewardLogContext(response_length=4096, stop_reason="length"),
    )
    harness.fail(mixed, 1, "gate timeout")
    harness.call("prepare_incomplete_retry", mixed)
    harness.dispatch(mixed, [1])
    harness.ready_group(2, group_id="ready", granularity=RecoveryGranularity.PROMPT_GROUP)
    harness.reserve(2, group_id="unadmitted", admitted=False, target_step=None)
    unknown = harness.ready_group(1, group_id="unknown")
    harness.call("mark_finalization_started", unknown)
    harness.call("mark_finalization_unknown", unknown)


@pytest.fixture
def rich(harness: Harness) -> Iterator[Harness]:
    build_rich_ledger(harness)
    yield harness


def test_state_dict_is_json_safe_versioned_and_round_trips_exactly(rich: Harness) -> None:
    state = rich.ledger.state_dict()
    assert state["schema_version"] == ROLLOUT_RECOVERY_SCHEMA_VERSION == 5
    assert frozenset({3, 4, 5}) == SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
    assert json.loads(json.dumps(state)) == state
    assert [group["group_id"] for group in state["groups"]] == [
        "mixed",
        "ready",
        "unadmitted",
        "unknown",
    ]
    attempt = state["groups"][0]["siblings"][1]["attempts"][0]
    assert re.fullmatch("[0-9a-f]{32}", attempt["attempt_uuid"])
    assert (attempt["status"], attempt["failure_reason"]) == ("failed", "gate timeout")
    restored = RolloutRecoveryLedger.from_state_dict(state)
    assert restored.state_dict() == state
    assert (
        restored.groups()[0].siblings[1].attempts[0]
        == rich.ledger.groups()[0].siblings[1].attempts[0]
    )


def test_state_fields_are_the_schema(rich: Harness) -> None:
    state = rich.ledger.state_dict()
    group = state["groups"][0]
    assert set(state) == _LEDGER_STATE_FIELDS
    assert set(group) == _GROUP_STATE_FIELDS
    assert set(group["prompt_ref"]) == _PROMPT_REF_STATE_FIELDS
    assert set(group["siblings"][0]) == _SIBLING_STATE_FIELDS
    assert set(group["siblings"][0]["attempts"][0]) == _ATTEMPT_STATE_FIELDS
    assert "runtime_prompt_payload" not in _GROUP_STATE_FIELDS


def test_state_shares_nothing_with_the_ledger_either_way(rich: Harness) -> None:
    state = rich.ledger.state_dict()
    pristine = copy.deepcopy(state)
    state["groups"][0]["siblings"][0]["attempts"][0]["staging_keys"].append("forged")
    state["groups"][0]["siblings"][0]["attempts"][0]["receipt"]["staging_keys"].append("forged")
    assert rich.ledger.state_dict() == pristine

    restored = RolloutRecoveryLedger.from_state_dict(pristine)
    keys = restored.expected_staging_keys()
    pristine["groups"][0]["siblings"][0]["attempts"][0]["receipt"]["staging_keys"].append("forged")
    pristine["groups"][0]["siblings"][0]["attempts"][0]["staging_keys"].append("forged")
    pristine["groups"][0]["status"] = "finalizing"
    assert restored.expected_staging_keys() == keys
    assert restored.state_dict() == rich.ledger.state_dict()


Edit = Callable[[dict[str, Any]], None]


def at(path: str) -> Callable[[dict[str, Any]], Any]:
    """Resolve a dotted path like 'groups.0.siblings.1' in a state dict."""

    def resolve(state: dict[str, Any]) -> Any:
        node: Any = state
        for part in path.split("."):
            node = node[int(part)] if part.isdigit() else node[part]
        return node

    return resolve


def set_field(path: str, field: str, value: Any) -> Edit:
    return lambda state: at(path)(state).__setitem__(field, value)


def del_field(path: str, field: str) -> Edit:
    return lambda state: at(path)(state).__delitem__(field)


MIXED = "groups.0"
SEALED = "groups.0.siblings.0.attempts.0"
FAILED = "groups.0.siblings.1.attempts.0"
RETRY = "groups.0.siblings.1.attempts.1"
RESERVED_ATTEMPT = "groups.0.siblings.2.attempts.0"


def copy_uuid_from_ready(state: dict[str, Any]) -> None:
    at(FAILED)(state)["attempt_uuid"] = at("groups.1.siblings.0.attempts.0")(state)["attempt_uuid"]


def copy_uuid_within_group(state: dict[str, Any]) -> None:
    at(RETRY)(state)["attempt_uuid"] = at(SEALED)(state)["attempt_uuid"]


def move_receipt_to_failed(state: dict[str, Any]) -> None:
    at(FAILED)(state)["receipt"] = copy.deepcopy(at(SEALED)(state)["receipt"])


def dispatch_in_ready_group(state: dict[str, Any]) -> None:
    attempt = at("groups.1.siblings.1.attempts.0")(state)
    attempt.update(
        status="dispatched", receipt=None, reward=None, mask_sample=None, staging_keys=[]
    )


def all_sealed_but_generating(state: dict[str, Any]) -> None:
    state["groups"][1]["status"] = "generating"


def duplicate_group(state: dict[str, Any]) -> None:
    state["groups"].append(copy.deepcopy(state["groups"][3]))


REJECTIONS: dict[str, tuple[Edit, type[Exception], list[str]]] = {
    "unknown top-level field": (
        lambda s: s.__setitem__("extra", 1),
        LedgerStateError,
        ["$: unknown field(s) 'extra'"],
    ),
    "unknown nested field": (
        set_field(SEALED, "color", 1),
        LedgerStateError,
        ["unknown field `color`", "$.groups[0].siblings[0].attempts[0]"],
    ),
    "missing top-level field": (
        lambda s: s.__delitem__("groups"),
        LedgerStateError,
        ["missing required field `groups`"],
    ),
    "missing nested field": (
        del_field(MIXED, "status"),
        LedgerStateError,
        ["missing required field `status`", "$.groups[0]"],
    ),
    "missing prompt ref field": (
        del_field("groups.0.prompt_ref", "task_name"),
        LedgerStateError,
        ["`task_name`", "$.groups[0].prompt_ref"],
    ),
    "wrong type": (
        set_field(MIXED, "expected_generations", "3"),
        LedgerStateError,
        ["Expected `int`, got `str`", "$.groups[0].expected_generations"],
    ),
    "bool for int": (
        set_field(MIXED, "start_weight_version", True),
        LedgerStateError,
        ["$.groups[0].start_weight_version"],
    ),
    "bad enum": (
        set_field(FAILED, "status", "done"),
        LedgerStateError,
        ["$.groups[0].siblings[1].attempts[0].status"],
    ),
    "bad granularity": (
        set_field(MIXED, "recovery_granularity", "atomic"),
        LedgerStateError,
        ["$.groups[0].recovery_granularity"],
    ),
    "negative target step": (
        set_field(MIXED, "target_step", -1),
        LedgerStateError,
        ["$.groups[0].target_step"],
    ),
    "attempt uuid not hex": (
        set_field(SEALED, "attempt_uuid", "not-a-uuid"),
        LedgerStateError,
        ["$.groups[0].siblings[0].attempts[0].attempt_uuid"],
    ),
    "attempt uuid canonical form": (
        lambda s: at(SEALED)(s).__setitem__("attempt_uuid", "12345678-1234-4234-8234-123456789abc"),
        LedgerStateError,
        ["$.groups[0].siblings[0].attempts[0].attempt_uuid"],
    ),
    "older version": (
        lambda s: s.__setitem__("schema_version", 2),
        UnsupportedSchemaVersionError,
        ["unsupported rollout recovery schema version 2", "reads: 3"],
    ),
    "newer version with new fields": (
        lambda s: s.update(schema_version=6, shards=[]),
        UnsupportedSchemaVersionError,
        ["version 6"],
    ),
    "version as string": (
        lambda s: s.__setitem__("schema_version", "3"),
        LedgerStateError,
        ["expected an int schema version, got '3'"],
    ),
    "missing version": (
        lambda s: s.__delitem__("schema_version"),
        LedgerStateError,
        ["missing required field 'schema_version'"],
    ),
    "duplicate attempt uuid across groups": (
        copy_uuid_from_ready,
        LedgerStateError,
        [
            "$.groups[1].siblings[0].attempts[0].attempt_uuid (group 'ready')",
            "duplicate attempt UUID",
        ],
    ),
    "duplicate attempt uuid in a group": (
        copy_uuid_within_group,
        LedgerStateError,
        [
            "$.groups[0].siblings[1].attempts[1].attempt_uuid (group 'mixed' sibling 1",
            "duplicate attempt UUID",
        ],
    ),
    "duplicate group id": (
        duplicate_group,
        LedgerStateError,
        ["$.groups[4]", "group id 'unknown' appears more than once"],
    ),
    "non-contiguous generation index": (
        set_field("groups.0.siblings.1", "generation_index", 2),
        LedgerStateError,
        [
            "$.groups[0].siblings[1].generation_index (group 'mixed')",
            "non-contiguous generation indices",
        ],
    ),
    "sibling count differs": (
        set_field(MIXED, "expected_generations", 4),
        LedgerStateError,
        ["expected_generations is 4 but the group has 3 siblings"],
    ),
    "no attempts": (
        set_field("groups.0.siblings.2", "attempts", []),
        LedgerStateError,
        ["$.groups[0].siblings[2].attempts"],
    ),
    "receipt on a failed attempt": (
        move_receipt_to_failed,
        LedgerStateError,
        [
            "$.groups[0].siblings[1].attempts[0].receipt (group 'mixed' sibling 1 attempt",
            "only a sealed attempt carries a receipt",
            "'failed'",
        ],
    ),
    "staging keys on a reserved attempt": (
        set_field(RESERVED_ATTEMPT, "staging_keys", ["k"]),
        LedgerStateError,
        ["sibling 2", "only a sealed attempt owns staging keys"],
    ),
    "reward on a dispatched attempt": (
        set_field(RETRY, "reward", 1.0),
        LedgerStateError,
        ["$.groups[0].siblings[1].attempts[1].reward"],
    ),
    "failure reason on a sealed attempt": (
        set_field(SEALED, "failure_reason", "x"),
        LedgerStateError,
        ["a sealed attempt has no failure_reason"],
    ),
    "failed attempt without a reason": (
        set_field(FAILED, "failure_reason", None),
        LedgerStateError,
        ["a failed attempt needs a non-empty reason"],
    ),
    "sealed without receipt": (
        set_field(SEALED, "receipt", None),
        LedgerStateError,
        ["$.groups[0].siblings[0].attempts[0].receipt", "needs a receipt"],
    ),
    "sealed without reward": (
        set_field(SEALED, "reward", None),
        LedgerStateError,
        ["needs a reward"],
    ),
    "non-finite reward": (
        set_field(SEALED, "reward", float("nan")),
        LedgerStateError,
        ["reward must be finite"],
    ),
    "receipt for another attempt": (
        lambda s: at(SEALED)(s)["receipt"].__setitem__("gate_rollout_id", "mixed_g0_a" + "0" * 32),
        LedgerStateError,
        ["receipt.gate_rollout_id", "is not this attempt's gate rollout id"],
    ),
    "malformed receipt": (
        lambda s: at(SEALED)(s)["receipt"].__setitem__("staging_keys", [1]),
        LedgerStateError,
        ["$.groups[0].siblings[0].attempts[0].receipt", "$.staging_keys[0]"],
    ),
    "staging keys differ from receipt": (
        lambda s: at(SEALED)(s)["staging_keys"].reverse(),
        LedgerStateError,
        ["differ from the receipt's staging_keys"],
    ),
    "superseded attempt still live": (
        lambda s: at(FAILED)(s).update(status="dispatched", failure_reason=None),
        LedgerStateError,
        [
            "$.groups[0].siblings[1].attempts[0].status",
            "superseded attempt must be 'failed' or 'abandoned'",
        ],
    ),
    "ready group with a dispatched attempt": (
        dispatch_in_ready_group,
        LedgerStateError,
        [
            "$.groups[1].status (group 'ready')",
            "'ready_to_finalize' contradicts sibling 1",
            "'dispatched'",
        ],
    ),
    "generating group with every attempt sealed": (
        all_sealed_but_generating,
        LedgerStateError,
        ["$.groups[1].status", "status 'generating' contradicts its siblings"],
    ),
    "unadmitted group with a dispatched attempt": (
        set_field("groups.2.siblings.0.attempts.0", "status", "dispatched"),
        LedgerStateError,
        [
            "$.groups[2].siblings[0].attempts[0].status (group 'unadmitted' sibling 0",
            "contradicts the group's phase 'reserved'",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_from_state_dict_rejects(rich: Harness, case: str) -> None:
    edit, error, fragments = REJECTIONS[case]
    state = rich.ledger.state_dict()
    edit(state)
    with pytest.raises(error) as raised:
        RolloutRecoveryLedger.from_state_dict(state)
    for fragment in fragments:
        assert fragment in str(raised.value)


@pytest.mark.parametrize("state", [None, [], "state", 3])
def test_from_state_dict_rejects_non_dicts(state: Any) -> None:
    with pytest.raises(LedgerStateError, match=r"\$: expected a dict"):
        RolloutRecoveryLedger.from_state_dict(state)


def test_reject_unknown_fields_names_them_all() -> None:
    _reject_unknown_fields({"a": 1}, expected=frozenset({"a", "b"}), context="ctx")
    with pytest.raises(
        LedgerStateError,
        match=r"ctx: unknown field\(s\) 'x', 'y'; schema version 5 has exactly: a, b",
    ):
        _reject_unknown_fields(
            {"a": 1, "y": 2, "x": 3}, expected=frozenset({"a", "b"}), context="ctx"
        )


def test_group_from_state_checks_attempt_uniqueness_against_seen_uuids(rich: Harness) -> None:
    state = rich.ledger.state_dict()
    seen: set[Any] = set()
    record = RolloutRecoveryLedger._group_from_state(state["groups"][1], seen_attempt_uuids=seen)
    assert record.group_id == "ready"
    assert seen == {sibling.attempts[0].attempt_uuid for sibling in record.siblings}
    with pytest.raises(LedgerStateError, match="duplicate attempt UUID"):
        RolloutRecoveryLedger._group_from_state(state["groups"][1], seen_attempt_uuids=seen)
    with pytest.raises(
        LedgerStateError, match=r"\$\.groups\[\?\].*missing required field `status`"
    ):
        broken = dict(state["groups"][1])
        del broken["status"]
        RolloutRecoveryLedger._group_from_state(broken, seen_attempt_uuids=set())


def test_a_restored_ledger_continues_where_the_original_stopped(rich: Harness) -> None:
    state = rich.ledger.state_dict()
    restored = Harness()
    try:
        restored.call("load_state_dict", state)
        restored.call("prepare_for_restart")
        record = restored.group("mixed")
        assert [len(sibling.attempts) for sibling in record.siblings] == [1, 3, 2]
        restored.dispatch("mixed")
        restored.seal("mixed", 1)
        restored.seal("mixed", 2)
        assert restored.group("mixed").status.value == "ready_to_finalize"
        again = RolloutRecoveryLedger.from_state_dict(restored.ledger.state_dict())
        assert again.state_dict() == restored.ledger.state_dict()
    finally:
        restored.close()
