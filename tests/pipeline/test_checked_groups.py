"""A ledger read from form 3 segments is checked as the records a restore loads (issue 16):
the records built straight from the packed pieces are exactly the group's, the state checks
on them accept and refuse exactly what they accept and refuse on the persisted state, with
the same message, and the records handed to a ledger are its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
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
)
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.state_checks import check_ledger_groups, check_ledger_state
from rollvault.ledger.state_convert import group_to_state
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION, LedgerState
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus


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


def _refusal(check: Callable[[], None]) -> str | None:
    try:
        check()
    except LedgerStateError as exc:
        return str(exc)
    return None


@given(groups=st.lists(_group(), max_size=4))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_checks_on_records_refuse_what_they_refuse_on_the_state_with_the_same_message(
    groups: list[PromptGroupRecoveryRecord],
) -> None:
    """Random groups: mostly impossible lineages, repeated group ids, bad receipts."""
    state = LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(group) for group in groups],
    )
    on_state = _refusal(lambda: check_ledger_state(state, path="$.ledger"))
    on_records = _refusal(lambda: check_ledger_groups(groups, path="$.ledger.groups"))
    assert on_records == on_state


def _valid(group_id: str, first_uuid: int) -> PromptGroupRecoveryRecord:
    record = _group_record(siblings=3)
    for position, sibling in enumerate(record.siblings):
        sibling.attempts[0].attempt_uuid = uuid.UUID(int=first_uuid + position)
    return msgspec.structs.replace(record, group_id=group_id)


def test_a_uuid_two_groups_share_is_refused_on_the_records_as_on_the_state() -> None:
    groups = [_valid("a", 1), _valid("b", 3)]  # b's sibling 0 reuses a's sibling 2's UUID
    state = LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(group) for group in groups],
    )
    message = _refusal(lambda: check_ledger_state(state, path="$.ledger"))
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
