"""A ledger read from form 3 segments is checked as the records a restore loads (issue 16):
the records built straight from the packed pieces are exactly the group's, the state checks
on them accept and refuse exactly what they accept and refuse on the persisted state, with
the same message, and the records handed to a ledger are its own."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_ledger_record_forms import _forge_containers, _group, _group_record

from rollvault.ledger.checked_groups import CheckedGroups
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.packed_groups import (
    PackedAttempt,
    PackedGroup,
    PackedHeader,
    group_records,
    pack_attempt,
    pack_header,
    screened_group_records,
)
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.reward_penalties import RewardChecks
from rollvault.ledger.state_checks import check_ledger_groups, check_ledger_state
from rollvault.ledger.state_convert import group_to_state
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION, LedgerState
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RolloutAttemptStatus,
)


def _packed(record: PromptGroupRecoveryRecord) -> PackedGroup:
    """``record`` as a form 3 segment's reader decodes it."""
    header = msgspec.msgpack.decode(pack_header(record), type=PackedHeader)
    siblings = [
        (
            sibling.generation_index,
            [
                msgspec.msgpack.decode(
                    pack_attempt(f"{record.group_id}_g{sibling.generation_index}_a", attempt),
                    type=PackedAttempt,
                )
                for attempt in sibling.attempts
            ],
        )
        for sibling in record.siblings
    ]
    return PackedGroup(header, siblings)


def _spoil(records: list[PromptGroupRecoveryRecord]) -> None:
    """Change every container of ``records`` in place (what a ledger may do to its own)."""
    for record in records:
        for sibling in record.siblings:
            sibling.attempts.append(
                RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=RolloutAttemptStatus.FAILED)
            )
            for attempt in sibling.attempts:
                _forge_containers(attempt)
        record.status = PromptGroupStatus.FINALIZATION_UNKNOWN


@given(groups=st.lists(_group(), max_size=4))
@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
def test_the_records_built_from_packed_pieces_are_exactly_the_groups_and_share_nothing(
    groups: list[PromptGroupRecoveryRecord],
) -> None:
    packed = [_packed(group) for group in groups]
    expected = [msgspec.structs.replace(group, runtime_prompt_payload=None) for group in groups]
    built = group_records(packed)
    assert built == expected
    _spoil(built)
    assert group_records(packed) == expected  # the pieces are as read


def _refusal(check: Callable[[], object]) -> str | None:
    try:
        check()
    except LedgerStateError as exc:
        return str(exc)
    return None


def _state_refusal(groups: list[PromptGroupRecoveryRecord]) -> str | None:
    """What the state checks say of ``groups`` persisted as a ledger state (None: accepted)."""
    state = LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(group) for group in groups],
    )
    return _refusal(lambda: check_ledger_state(state, path="$.ledger"))


@given(groups=st.lists(_group(), max_size=4))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_checks_on_records_refuse_what_they_refuse_on_the_state_with_the_same_message(
    groups: list[PromptGroupRecoveryRecord],
) -> None:
    """Random groups: mostly impossible lineages, repeated group ids, bad receipts."""
    on_state = _state_refusal(groups)
    on_records = _refusal(lambda: check_ledger_groups(groups, path="$.ledger.groups"))
    assert on_records == on_state


def _valid(group_id: str, first_uuid: int) -> PromptGroupRecoveryRecord:
    record = _group_record(siblings=3)
    for position, sibling in enumerate(record.siblings):
        sibling.attempts[0].attempt_uuid = uuid.UUID(int=first_uuid + position)
    return msgspec.structs.replace(record, group_id=group_id)


def test_a_uuid_two_groups_share_is_refused_on_the_records_as_on_the_state() -> None:
    groups = [_valid("a", 1), _valid("b", 3)]  # b's sibling 0 reuses a's sibling 2's UUID
    message = _state_refusal(groups)
    assert message is not None
    assert "$.ledger.groups[1].siblings[0].attempts[0].attempt_uuid" in message
    assert uuid.UUID(int=3).hex in message
    with pytest.raises(LedgerStateError) as refused:
        CheckedGroups([_packed(group) for group in groups], path="$.ledger.groups")
    assert str(refused.value) == message


def test_the_checked_records_go_to_the_first_ledger_and_the_rest_is_built_again() -> None:
    groups = [_valid("a", 1), _valid("b", 10)]
    expected = [msgspec.structs.replace(group, runtime_prompt_payload=None) for group in groups]
    checked = CheckedGroups([_packed(group) for group in groups], path="$.ledger.groups")
    assert len(checked) == 2
    viewed = checked.view()
    first = checked.take()
    assert list(first.values()) == expected
    assert all(a is b for a, b in zip(first.values(), viewed, strict=True))  # no copy
    _spoil(list(first.values()))  # the first ledger changes its own records
    assert list(checked.view()) == expected
    second = checked.take()
    assert list(second.values()) == expected
    assert not any(a is b for a, b in zip(first.values(), second.values(), strict=True))
    assert checked.state() == LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(group) for group in expected],
    )


# -- the screen made while building: nearly valid groups -------------------------------------
# Random groups (above) are almost never valid, so the screen's clear path would go
# untested there. These are valid groups with at most one change that may break a rule.

_A = RolloutAttemptStatus
_FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def _sealed(draw: st.DrawFn, gate_id: str, attempt_uuid: uuid.UUID) -> RolloutAttemptRecord:
    keys = [f"{gate_id}/{k}" for k in range(draw(st.integers(1, 3)))]
    reward = draw(_FINITE)
    receipt: dict[str, Any] = {"gate_rollout_id": gate_id, "staging_keys": list(keys)}
    if draw(st.booleans()):
        receipt["row_digests"] = [
            {"length": draw(st.integers(0, 99)), "digest": draw(st.binary(min_size=1)).hex()}
            for _key in keys
        ]
    if draw(st.booleans()):
        receipt["reward"] = reward
    if draw(st.booleans()):
        receipt["weight_version"] = draw(st.integers(0, 5))
    if draw(st.booleans()):
        receipt["worker_id"] = "w"
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=_A.SEALED,
        receipt=receipt,
        reward=reward,
        mask_sample=draw(st.booleans()),
        reward_checks=draw(
            st.one_of(
                st.none(),
                st.just(RewardChecks(overlong=False, format_ok=True, finite_logprobs=True)),
            )
        ),
        staging_keys=keys,
    )


def _unsealed(status: RolloutAttemptStatus, attempt_uuid: uuid.UUID) -> RolloutAttemptRecord:
    failed = status is _A.FAILED
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=status,
        failure_reason="lost" if failed else None,
        failure_kind=AttemptFailureKind.INFRA if failed else None,
    )


@st.composite
def _valid_group(draw: st.DrawFn, group_id: str) -> PromptGroupRecoveryRecord:
    reserved = draw(st.integers(0, 4)) == 0
    siblings = []
    for index in range(draw(st.integers(1, 3))):
        gate_prefix = f"{group_id}_g{index}_a"
        superseded = draw(
            st.lists(st.sampled_from([_A.ABANDONED] if reserved else [_A.FAILED, _A.ABANDONED]))
        )
        attempts = [_unsealed(status, uuid.uuid4()) for status in superseded[:2]]
        current = draw(st.sampled_from([_A.RESERVED, _A.ABANDONED] if reserved else list(_A)))
        attempt_uuid = uuid.uuid4()
        attempts.append(
            draw(_sealed(gate_prefix + attempt_uuid.hex, attempt_uuid))
            if current is _A.SEALED
            else _unsealed(current, attempt_uuid)
        )
        siblings.append(RolloutSiblingRecord(generation_index=index, attempts=attempts))
    all_sealed = all(sibling.attempts[-1].status is _A.SEALED for sibling in siblings)
    status = (
        draw(
            st.sampled_from(
                [
                    PromptGroupStatus.READY_TO_FINALIZE,
                    PromptGroupStatus.FINALIZING,
                    PromptGroupStatus.FINALIZATION_UNKNOWN,
                ]
            )
        )
        if all_sealed
        else PromptGroupStatus.GENERATING
    )
    base = _group_record(siblings=len(siblings))
    return msgspec.structs.replace(
        base,
        group_id=group_id,
        siblings=siblings,
        phase=PromptGroupPhase.RESERVED if reserved else PromptGroupPhase.ADMITTED,
        status=status,
    )


_SPOILS = (
    "none",
    "attempt_status",
    "reward",
    "mask_sample",
    "receipt_reward",
    "receipt_key_order",
    "row_digest",
    "row_count",
    "failure_reason",
    "failure_kind",
    "group_status",
    "expected_generations",
    "generation_index",
    "duplicate_uuid",
    "duplicate_group",
)


def _spoil_one(draw: st.DrawFn, groups: list[PromptGroupRecoveryRecord], spoil: str) -> None:
    group = draw(st.sampled_from(groups))
    sibling = draw(st.sampled_from(group.siblings))
    attempt = draw(st.sampled_from(sibling.attempts))
    receipt = attempt.receipt
    if spoil == "attempt_status":
        attempt.status = draw(st.sampled_from(RolloutAttemptStatus))
    elif spoil == "reward":
        attempt.reward = draw(st.sampled_from([None, math.inf, -math.inf, math.nan, 0.5]))
    elif spoil == "mask_sample":
        attempt.mask_sample = None if attempt.mask_sample is not None else True
    elif spoil == "receipt_reward" and receipt is not None:
        receipt["reward"] = draw(st.sampled_from([math.inf, math.nan, 7.25]))
    elif spoil == "receipt_key_order" and receipt is not None:
        # Two unknown keys whose dict order is not their sorted order: a segment stores
        # the receipt sorted, and both forms must name the same one.
        attempt.receipt = {"0": None, **receipt, "": None}
    elif spoil == "row_digest" and receipt is not None and "row_digests" in receipt:
        receipt["row_digests"][0]["digest"] = ""
    elif spoil == "row_count" and receipt is not None:
        receipt["row_digests"] = [{"length": 1, "digest": "ab"}] * (len(attempt.staging_keys) + 1)
    elif spoil == "failure_reason":
        attempt.failure_reason = draw(st.sampled_from([None, "", "why"]))
    elif spoil == "failure_kind":
        attempt.failure_kind = draw(st.sampled_from([None, AttemptFailureKind.DATA]))
    elif spoil == "group_status":
        group.status = draw(st.sampled_from(PromptGroupStatus))
    elif spoil == "expected_generations":
        # Never below 1: the header's schema refuses that before any check.
        group.expected_generations += (
            draw(st.sampled_from([-1, 1])) if group.expected_generations > 1 else 1
        )
    elif spoil == "generation_index":
        sibling.generation_index = draw(st.integers(0, 3))
    elif spoil == "duplicate_uuid":
        other = draw(st.sampled_from(groups))
        attempt.attempt_uuid = draw(st.sampled_from(other.siblings)).attempts[0].attempt_uuid
    elif spoil == "duplicate_group":
        group.group_id = draw(st.sampled_from(groups)).group_id


@st.composite
def _nearly_valid(draw: st.DrawFn) -> tuple[list[PromptGroupRecoveryRecord], str]:
    count = draw(st.integers(1, 3))
    groups = [draw(_valid_group(f"group{number}")) for number in range(count)]
    spoil = draw(st.sampled_from(_SPOILS))
    if spoil != "none":
        _spoil_one(draw, groups, spoil)
    return groups, spoil


@given(case=_nearly_valid())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_screen_clears_only_what_the_checks_accept_and_refusals_keep_their_message(
    case: tuple[list[PromptGroupRecoveryRecord], str],
) -> None:
    groups, spoil = case
    on_state = _state_refusal(groups)
    packed = [_packed(group) for group in groups]
    _records, clean = screened_group_records(packed)
    if clean:
        assert on_state is None  # the screen never clears what the checks refuse
    if spoil == "none":
        assert on_state is None and clean  # a valid ledger skips the checks
    on_pieces = _refusal(lambda: CheckedGroups(packed, path="$.ledger.groups"))
    assert on_pieces == on_state


@given(groups=st.lists(_group(), max_size=4))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_checked_packed_groups_refuse_what_the_state_checks_refuse_with_the_same_message(
    groups: list[PromptGroupRecoveryRecord],
) -> None:
    on_state = _state_refusal(groups)
    packed = [_packed(group) for group in groups]
    assert _refusal(lambda: CheckedGroups(packed, path="$.ledger.groups")) == on_state


@given(data=st.data())
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_a_receipt_s_bad_keys_are_named_alike_whatever_order_it_was_stored_in(
    data: st.DataObject,
) -> None:
    # A segment stores a receipt kept as a dict with its keys sorted; msgspec names the
    # first bad key in the dict's own order. Both forms must give the same message.
    group = data.draw(_valid_group("group0"))
    sealed = [
        attempt
        for sibling in group.siblings
        for attempt in sibling.attempts
        if attempt.receipt is not None
    ]
    assume(sealed)
    attempt = data.draw(st.sampled_from(sealed))
    assert attempt.receipt is not None
    attempt.receipt = {"0": None, **attempt.receipt, "": None}
    on_state = _state_refusal([group])
    assert on_state is not None and "unknown field" in on_state
    packed = [_packed(group)]
    assert _refusal(lambda: CheckedGroups(packed, path="$.ledger.groups")) == on_state


def _sealed_group(rows: list[dict[str, Any]]) -> PromptGroupRecoveryRecord:
    """One admitted group of one sibling, sealed with two staged rows and ``rows`` as
    its receipt's row digests."""
    attempt_uuid = uuid.UUID(int=7)
    gate_id = f"g_g0_a{attempt_uuid.hex}"
    keys = [f"{gate_id}/0", f"{gate_id}/1"]
    sealed = RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=_A.SEALED,
        receipt={"gate_rollout_id": gate_id, "staging_keys": list(keys), "row_digests": rows},
        reward=0.5,
        mask_sample=False,
        staging_keys=keys,
    )
    return msgspec.structs.replace(
        _group_record(siblings=1),
        siblings=[RolloutSiblingRecord(generation_index=0, attempts=[sealed])],
        status=PromptGroupStatus.READY_TO_FINALIZE,
    )


@pytest.mark.parametrize(
    ("rows", "refused"),
    [
        ([{"length": 3, "digest": "ab"}, {"length": 4, "digest": "cd"}], None),
        ([{"length": 3, "digest": "ab"}], "row_digests has 1 entries"),
        ([{"length": 3, "digest": "ab"}] * 3, "row_digests has 3 entries"),
        ([{"length": 3, "digest": "ab"}, {"length": 4, "digest": ""}], "digest"),
    ],
    ids=["one_per_key", "fewer_than_keys", "more_than_keys", "an_empty_digest"],
)
def test_the_screen_clears_a_sealed_attempt_only_with_one_non_empty_row_digest_per_key(
    rows: list[dict[str, Any]], refused: str | None
) -> None:
    # Each case on its own: the random ones above reach these rules only by chance.
    group = _sealed_group(rows)
    on_state = _state_refusal([group])
    assert (on_state is None) == (refused is None), on_state
    if refused is not None:
        assert on_state is not None and refused in on_state
    _records, clean = screened_group_records([_packed(group)])
    assert clean == (refused is None)
