"""The sidecar envelope: build, parse, deterministic JSON bytes, defensive copies, rejections."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from ledger_testkit import Harness

from rollvault.ledger.statuses import AttemptFailureKind
from rollvault.rollout_recovery import (
    _SIDECAR_STATE_FIELDS,
    ROLLOUT_RECOVERY_STATE_FILENAME,
    CaptureRewardSettings,
    FinalizedReward,
    LedgerStateError,
    ParsedRolloutRecoveryState,
    RolloutRecoveryLedger,
    UnsupportedSchemaVersionError,
    _validate_batch_shortfall,
    _validate_finalizer_metrics,
    _validate_finalizer_rewards,
    build_rollout_recovery_state,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
    parse_rollout_recovery_state,
)

SETTINGS = CaptureRewardSettings(
    overlong_penalty=0.5, mask_overlong=False, format_penalty=1.0, mask_nonfinite_logprobs=True
)


@pytest.fixture
def ledger(harness: Harness) -> Iterator[Harness]:
    harness.ready_group(2, group_id="ready")
    generating = harness.reserve(3, group_id="generating")
    harness.dispatch(generating)
    harness.seal(generating, 1)
    harness.ready_group(1, group_id="published")
    yield harness


def controller_state() -> dict[str, Any]:
    return {
        "batch_shortfall": {7: 2, 3: 0},
        "sampler_stamps_target_steps": True,
        "finalizer_metrics_by_group": {"ready": {"mean_reward": 0.5, "masked": 1}},
        "finalizer_rewards_by_group": {
            "ready": [
                FinalizedReward(raw_reward=1.0, reward=0.5, masked=False),
                FinalizedReward(raw_reward=0.0, reward=-1.0, masked=True),
            ]
        },
        "reward_settings": SETTINGS,
    }


def build(harness: Harness, **overrides: Any) -> dict[str, Any]:
    kwargs = {**controller_state(), "canonical_group_ids": {"published"}, **overrides}
    return build_rollout_recovery_state(harness.ledger, **kwargs)


def test_filename_is_json_never_pickle() -> None:
    assert ROLLOUT_RECOVERY_STATE_FILENAME == "rollout_recovery.json"


def test_build_leaves_canonical_groups_out_and_is_json_safe(ledger: Harness) -> None:
    state = build(ledger)
    assert set(state) == _SIDECAR_STATE_FIELDS
    assert state["schema_version"] == 5 and state["ledger"]["schema_version"] == 5
    assert [group["group_id"] for group in state["ledger"]["groups"]] == ["ready", "generating"]
    assert state["batch_shortfall"] == {"3": 0, "7": 2}
    assert json.loads(json.dumps(state)) == state
    assert state["reward_settings"]["overlong_penalty"] == 0.5
    full = build(ledger, canonical_group_ids=None)
    assert [group["group_id"] for group in full["ledger"]["groups"]] == [
        "ready",
        "generating",
        "published",
    ]


def test_parse_splits_the_sidecar_by_owner(ledger: Harness) -> None:
    parsed = parse_rollout_recovery_state(build(ledger))
    assert isinstance(parsed, ParsedRolloutRecoveryState)
    assert parsed.batch_shortfall == {3: 0, 7: 2}
    assert parsed.sampler_stamps_target_steps is True
    assert parsed.finalizer_metrics_by_group == {"ready": {"mean_reward": 0.5, "masked": 1.0}}
    assert parsed.finalizer_rewards_by_group == controller_state()["finalizer_rewards_by_group"]
    assert parsed.reward_settings == SETTINGS
    restored = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
    assert [group.group_id for group in restored.groups()] == ["ready", "generating"]
    assert restored.get_group("ready") == _without_payload(ledger.group("ready"))


def _without_payload(record: Any) -> Any:
    record.runtime_prompt_payload = None
    return record


def test_encoding_is_deterministic_and_round_trips_byte_for_byte(ledger: Harness) -> None:
    state = build(ledger)
    data = encode_rollout_recovery_state(state)
    assert data == encode_rollout_recovery_state(copy.deepcopy(state))
    assert json.loads(data) == state
    keys = list(json.loads(data))
    assert keys == sorted(keys)

    parsed = decode_rollout_recovery_state(data)
    rebuilt_ledger = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
    rebuilt = build_rollout_recovery_state(
        rebuilt_ledger,
        batch_shortfall=parsed.batch_shortfall,
        sampler_stamps_target_steps=bool(parsed.sampler_stamps_target_steps),
        finalizer_metrics_by_group=parsed.finalizer_metrics_by_group,
        finalizer_rewards_by_group=parsed.finalizer_rewards_by_group,
        reward_settings=parsed.reward_settings,
    )
    assert encode_rollout_recovery_state(rebuilt) == data


def test_decoding_and_parsing_agree(ledger: Harness) -> None:
    state = build(ledger)
    assert decode_rollout_recovery_state(
        encode_rollout_recovery_state(state)
    ) == parse_rollout_recovery_state(state)


def test_build_shares_nothing_with_its_inputs(ledger: Harness) -> None:
    inputs = controller_state()
    state = build_rollout_recovery_state(ledger.ledger, **inputs)
    snapshot = copy.deepcopy(state)
    inputs["batch_shortfall"][7] = 99
    inputs["finalizer_metrics_by_group"]["ready"]["mean_reward"] = 99.0
    inputs["finalizer_rewards_by_group"]["ready"].append(
        FinalizedReward(raw_reward=9.0, reward=9.0, masked=False)
    )
    assert state == snapshot
    state["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["staging_keys"].append("forged")
    assert "forged" not in ledger.ledger.expected_staging_keys()


def test_parse_shares_nothing_with_the_state(ledger: Harness) -> None:
    state = build(ledger)
    parsed = parse_rollout_recovery_state(state)
    expected = copy.deepcopy(parsed)
    state["batch_shortfall"]["7"] = 99
    state["finalizer_metrics_by_group"]["ready"]["mean_reward"] = 99.0
    state["finalizer_rewards_by_group"]["ready"].clear()
    state["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["receipt"]["staging_keys"].append(
        "forged"
    )
    state["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["staging_keys"].append("forged")
    assert parsed == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [({}, {}), ({2: 1, 0: 3}, {0: 3, 2: 1}), ({"12": 4}, {12: 4})],
)
def test_validate_batch_shortfall_accepts_steps(
    value: dict[Any, Any], expected: dict[int, int]
) -> None:
    result = _validate_batch_shortfall(value)
    assert result == expected and list(result) == sorted(expected)
    assert result is not value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "expected a dict"),
        ({"-1": 1}, "key '-1' is not a target step"),
        ({-1: 1}, "key -1 is not a target step"),
        ({"07": 1}, "key '07' is not a target step"),
        ({"x": 1}, "key 'x' is not a target step"),
        ({True: 1}, "key True is not a target step"),
        ({1: -2}, "expected a non-negative int group count, got -2"),
        ({1: 1.0}, "expected a non-negative int group count, got 1.0"),
        ({1: 1, "1": 2}, "step 1 appears more than once"),
    ],
)
def test_validate_batch_shortfall_rejects(value: Any, message: str) -> None:
    with pytest.raises(LedgerStateError, match=message):
        _validate_batch_shortfall(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "expected a dict"),
        ({"g": [1.0]}, r"finalizer_metrics_by_group\['g'\]: expected a dict"),
        ({"g": {"m": float("nan")}}, r"\['g'\]\['m'\]: expected a finite number"),
        ({"g": {"m": "1"}}, "expected a finite number, got '1'"),
        ({"g": {"m": True}}, "expected a finite number, got True"),
        ({"g": {1: 1.0}}, "metric names must be str"),
        ({"": {}}, "group ids must be non-empty str"),
    ],
)
def test_validate_finalizer_metrics_rejects(value: Any, message: str) -> None:
    with pytest.raises(LedgerStateError, match=message):
        _validate_finalizer_metrics(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "expected a dict"),
        ({"g": [{"raw_reward": 1.0, "reward": 1.0}]}, "missing required field `masked`"),
        ({"g": [{"raw_reward": 1.0, "reward": 1.0, "masked": False, "x": 1}]}, "unknown field `x`"),
        (
            {"g": [{"raw_reward": "1", "reward": 1.0, "masked": False}]},
            r"\['g'\]: Expected `float`, got `str` - at `\$\[0\]\.raw_reward`",
        ),
        ({7: []}, "group ids must be non-empty str"),
        (
            {"g": [FinalizedReward(raw_reward=float("inf"), reward=1.0, masked=False)]},
            r"\['g'\]\[0\]\.raw_reward: expected a finite number",
        ),
        (
            {"g": FinalizedReward(raw_reward=1.0, reward=1.0, masked=False)},
            "Expected `array`, got `object`",
        ),
    ],
)
def test_validate_finalizer_rewards_rejects(value: Any, message: str) -> None:
    with pytest.raises(LedgerStateError, match=message):
        _validate_finalizer_rewards(value)


def test_validate_finalizer_rewards_accepts_records_and_dicts() -> None:
    result = _validate_finalizer_rewards(
        {
            "g": [
                FinalizedReward(raw_reward=1.0, reward=1.0, masked=False),
                {"raw_reward": 0, "reward": 0, "masked": True},
            ]
        }
    )
    assert result == {
        "g": [
            FinalizedReward(raw_reward=1.0, reward=1.0, masked=False),
            FinalizedReward(raw_reward=0.0, reward=0.0, masked=True),
        ]
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sampler_stamps_target_steps": None}, "sampler_stamps_target_steps must be a bool"),
        ({"canonical_group_ids": "published"}, "canonical_group_ids must be a set of group ids"),
        (
            {"reward_settings": {"overlong_penalty": 1.0}},
            "reward_settings: Object missing required field",
        ),
        ({"batch_shortfall": {"a": 1}}, "batch_shortfall"),
    ],
)
def test_build_rejects_bad_controller_state(
    ledger: Harness, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build(ledger, **overrides)


def test_build_needs_a_ledger() -> None:
    with pytest.raises(ValueError, match="expected a RolloutRecoveryLedger, got dict"):
        build_rollout_recovery_state({}, batch_shortfall={}, sampler_stamps_target_steps=True)  # type: ignore[arg-type]


def sidecar_edits() -> dict[str, tuple[Any, type[Exception], str]]:
    def edit(path: list[Any], value: Any) -> Any:
        def apply(state: dict[str, Any]) -> None:
            node = state
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value

        return apply

    return {
        "unknown field": (edit(["color"], 1), LedgerStateError, "unknown field(s) 'color'"),
        "missing field": (
            lambda s: s.__delitem__("reward_settings"),
            LedgerStateError,
            "missing required field `reward_settings`",
        ),
        "wrong type": (
            edit(["sampler_stamps_target_steps"], "yes"),
            LedgerStateError,
            "at `$.sampler_stamps_target_steps`",
        ),
        "negative shortfall": (
            edit(["batch_shortfall", "7"], -1),
            LedgerStateError,
            "batch_shortfall['7']: expected a non-negative int",
        ),
        "bad shortfall key": (
            edit(["batch_shortfall", "x"], 1),
            LedgerStateError,
            "key 'x' is not a target step",
        ),
        "unsupported version": (
            edit(["schema_version"], 9),
            UnsupportedSchemaVersionError,
            "version 9",
        ),
        "unsupported ledger version": (
            edit(["ledger", "schema_version"], 2),
            UnsupportedSchemaVersionError,
            "$.ledger.schema_version",
        ),
        "ledger semantics": (
            edit(["ledger", "groups", 0, "status"], "generating"),
            LedgerStateError,
            "$.ledger.groups[0].status (group 'ready')",
        ),
        "ledger type": (
            edit(["ledger", "groups", 1, "target_step"], "4"),
            LedgerStateError,
            "at `$.ledger.groups[1].target_step`",
        ),
        "bad metric": (
            edit(["finalizer_metrics_by_group", "ready", "mean_reward"], None),
            LedgerStateError,
            "finalizer_metrics_by_group['ready']['mean_reward']: expected a finite number, got None",
        ),
        "bad reward": (
            edit(["finalizer_rewards_by_group", "ready", 1, "masked"], "no"),
            LedgerStateError,
            "finalizer_rewards_by_group['ready']: Expected `bool`, got `str` - at `$[1].masked`",
        ),
        "bad settings": (
            edit(["reward_settings", "mask_overlong"], 0),
            LedgerStateError,
            "$.reward_settings.mask_overlong",
        ),
    }


ENVELOPE_CASES = {"unknown field", "missing field", "unsupported version"}


@pytest.mark.parametrize("case", sorted(sidecar_edits()))
def test_parse_and_decode_reject_the_same_states(ledger: Harness, case: str) -> None:
    edit, error, message = sidecar_edits()[case]
    state = build(ledger)
    edit(state)
    with pytest.raises(error) as parsed:
        parse_rollout_recovery_state(state)
    assert message in str(parsed.value)
    with pytest.raises(error) as decoded:
        decode_rollout_recovery_state(json.dumps(state).encode())
    assert str(decoded.value) == f"{ROLLOUT_RECOVERY_STATE_FILENAME}: {parsed.value}"
    if case in ENVELOPE_CASES:
        with pytest.raises(error):
            encode_rollout_recovery_state(state)
    else:
        # Encoding checks only the envelope; the bytes are refused when read back.
        with pytest.raises(error):
            decode_rollout_recovery_state(encode_rollout_recovery_state(state))


def test_encode_refuses_a_state_it_cannot_write(ledger: Harness) -> None:
    state = build(ledger)
    with pytest.raises(LedgerStateError, match="expected a dict, got list"):
        encode_rollout_recovery_state([])  # type: ignore[arg-type]
    del state["ledger"]
    with pytest.raises(LedgerStateError, match="missing required field\\(s\\) ledger"):
        encode_rollout_recovery_state(state)
    state = build(ledger)
    state["batch_shortfall"] = {"1": object()}
    with pytest.raises(LedgerStateError, match="not JSON-safe builtins"):
        encode_rollout_recovery_state(state)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not valid JSON"),
        (b'{"schema_version": 3,', "not valid JSON"),
        (b"[]", r"sidecar \$: expected a dict, got list"),
        (b"\x80\x04\x95", "not valid JSON"),
    ],
)
def test_decode_rejects_corrupt_bytes(data: bytes, message: str) -> None:
    with pytest.raises(LedgerStateError, match=message) as raised:
        decode_rollout_recovery_state(data)
    assert ROLLOUT_RECOVERY_STATE_FILENAME in str(raised.value)


def test_decode_detects_a_flipped_byte(ledger: Harness) -> None:
    data = bytearray(encode_rollout_recovery_state(build(ledger)))
    position = data.index(b'"ready_to_finalize"') + 1
    data[position] = ord("R")
    with pytest.raises(LedgerStateError, match="status"):
        decode_rollout_recovery_state(bytes(data))


def test_decode_refuses_non_bytes() -> None:
    with pytest.raises(LedgerStateError, match="expected bytes, got str"):
        decode_rollout_recovery_state("{}")  # type: ignore[arg-type]


def test_an_empty_ledger_round_trips(harness: Harness) -> None:
    state = build_rollout_recovery_state(
        harness.ledger, batch_shortfall={}, sampler_stamps_target_steps=False
    )
    parsed = decode_rollout_recovery_state(encode_rollout_recovery_state(state))
    assert parsed.ledger_state == {"schema_version": 5, "groups": []}
    assert (
        parsed.finalizer_metrics_by_group,
        parsed.finalizer_rewards_by_group,
        parsed.reward_settings,
    ) == ({}, {}, None)


# -- the previous schema version -------------------------------------------------------


def as_version_3(state: dict[str, Any]) -> dict[str, Any]:
    """A current sidecar as schema version 3 wrote it: no attempt failure kinds, no turns."""
    old = copy.deepcopy(state)
    old["schema_version"] = old["ledger"]["schema_version"] = 3
    for group in old["ledger"]["groups"]:
        for sibling in group["siblings"]:
            for attempt in sibling["attempts"]:
                del attempt["failure_kind"], attempt["turn_keys"], attempt["env_state_revision"]
    return old


def as_version_4(state: dict[str, Any]) -> dict[str, Any]:
    """A current sidecar as schema version 4 wrote it: no committed turns."""
    old = copy.deepcopy(state)
    old["schema_version"] = old["ledger"]["schema_version"] = 4
    for group in old["ledger"]["groups"]:
        for sibling in group["siblings"]:
            for attempt in sibling["attempts"]:
                del attempt["turn_keys"], attempt["env_state_revision"]
    return old


def test_a_version_4_sidecar_loads_with_no_committed_turns(failing: Harness) -> None:
    current = build(failing)
    old = as_version_4(current)
    assert "turn_keys" not in json.dumps(old)
    parsed = decode_rollout_recovery_state(json.dumps(old).encode())
    assert parsed.ledger_state == parse_rollout_recovery_state(current).ledger_state
    old["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["turn_keys"] = []
    with pytest.raises(LedgerStateError, match="unknown field 'turn_keys' in schema version 4"):
        parse_rollout_recovery_state(old)


@pytest.fixture
def failing(ledger: Harness) -> Harness:
    """The ledger fixture plus a group with a data failure and an infra failure."""
    group_id = ledger.reserve(2, group_id="failing")
    ledger.dispatch(group_id)
    for index, reason in enumerate(["data: environment rejects this prompt", "infra: worker lost"]):
        gate = ledger.gate_id(group_id, index)
        ledger.call(
            "mark_sibling_failed",
            group_id,
            generation_index=index,
            gate_rollout_id=gate,
            reason=reason,
            failure_kind=AttemptFailureKind(reason.split(":")[0]),
        )
    return ledger


def test_a_version_3_sidecar_still_loads_with_kinds_read_from_the_reasons(
    failing: Harness,
) -> None:
    current = build(failing)
    old = as_version_3(current)
    assert "failure_kind" not in json.dumps(old)
    for parsed in (
        parse_rollout_recovery_state(old),
        decode_rollout_recovery_state(json.dumps(old).encode()),
    ):
        assert parsed.ledger_state == parse_rollout_recovery_state(current).ledger_state
        assert parsed.ledger_state["schema_version"] == 5
        restored = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
        kinds = [s.current_attempt.failure_kind for s in restored.get_group("failing").siblings]
        assert kinds == [AttemptFailureKind.DATA, AttemptFailureKind.INFRA]
    # The ledger state alone, as version 3, loads too.
    ledger_v3 = RolloutRecoveryLedger.from_state_dict(old["ledger"])
    assert ledger_v3.state_dict() == parse_rollout_recovery_state(current).ledger_state


def test_a_version_3_sidecar_is_held_to_version_3(failing: Harness) -> None:
    old = as_version_3(build(failing))
    old["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["failure_kind"] = "data"
    for read in (
        parse_rollout_recovery_state,
        lambda s: decode_rollout_recovery_state(json.dumps(s).encode()),
    ):
        with pytest.raises(
            LedgerStateError,
            match=r"\$\.ledger\.groups\[0\]\.siblings\[0\]\.attempts\[0\]: unknown field 'failure_kind' in schema version 3",
        ):
            read(old)


def test_a_version_4_failure_needs_its_kind(failing: Harness) -> None:
    state = build(failing)
    position = [g["group_id"] for g in state["ledger"]["groups"]].index("failing")
    state["ledger"]["groups"][position]["siblings"][1]["attempts"][0]["failure_kind"] = None
    with pytest.raises(LedgerStateError, match="a failed attempt needs a failure_kind"):
        parse_rollout_recovery_state(state)
    state["ledger"]["groups"][position]["siblings"][1]["attempts"][0]["failure_kind"] = "infra"
    state["ledger"]["groups"][0]["siblings"][0]["attempts"][0]["failure_kind"] = "infra"
    with pytest.raises(LedgerStateError, match="a sealed attempt has no failure_kind"):
        decode_rollout_recovery_state(json.dumps(state).encode())


def test_the_ledger_part_has_the_envelope_version(failing: Harness) -> None:
    state = build(failing)
    state["ledger"]["schema_version"] = 3
    with pytest.raises(LedgerStateError, match="3 differs from the envelope's schema version 5"):
        decode_rollout_recovery_state(json.dumps(state).encode())


def test_load_parsed_state_builds_what_load_state_dict_builds(ledger: Harness) -> None:
    parsed = decode_rollout_recovery_state(encode_rollout_recovery_state(build(ledger)))
    fast, checked = RolloutRecoveryLedger(), RolloutRecoveryLedger()
    ledger.mutate(lambda: fast.load_parsed_state(ledger.cut, parsed))
    ledger.mutate(lambda: checked.load_state_dict(ledger.cut, parsed.ledger_state))
    assert fast.state_dict() == checked.state_dict() == parsed.ledger_state
    # The records share nothing with the typed state they were built from.
    assert parsed.checked_ledger is not None  # a version 5 sidecar: the typed state
    typed = parsed.checked_ledger.groups[0].siblings[0].attempts[0]
    typed.staging_keys.append("forged")
    assert typed.receipt is not None
    typed.receipt["staging_keys"].append("forged")
    assert "forged" not in fast.expected_staging_keys()
    assert "forged" not in json.dumps(fast.state_dict())


def test_the_parsed_ledger_state_is_built_only_when_asked_for(ledger: Harness) -> None:
    state = build(ledger)
    parsed = decode_rollout_recovery_state(encode_rollout_recovery_state(state))
    loaded = RolloutRecoveryLedger()
    ledger.mutate(lambda: loaded.load_parsed_state(ledger.cut, parsed))
    assert "ledger_state" not in parsed.__dict__  # a restore never builds the builtins
    assert parsed.ledger_state == json.loads(json.dumps(state))["ledger"]
    assert parsed.ledger_state is parsed.ledger_state  # built once
    # The builtins are a copy: changing them changes neither the typed state nor the ledger.
    parsed.ledger_state["groups"][0]["siblings"][0]["attempts"][0]["status"] = "failed"
    assert parsed.checked_ledger is not None
    assert parsed.checked_ledger.groups[0].siblings[0].attempts[0].status != "failed"
    assert loaded.state_dict() == json.loads(json.dumps(state))["ledger"]


def test_a_ledger_state_made_by_hand_is_checked_when_loaded(ledger: Harness) -> None:
    parsed = decode_rollout_recovery_state(encode_rollout_recovery_state(build(ledger)))
    damaged = copy.deepcopy(dict(parsed.ledger_state))
    damaged["groups"][0]["siblings"][0]["attempts"][0]["status"] = "failed"
    with pytest.raises(LedgerStateError, match=r"groups\[0\]\.siblings\[0\]\.attempts\[0\]"):
        ledger.mutate(lambda: RolloutRecoveryLedger().load_state_dict(ledger.cut, damaged))
