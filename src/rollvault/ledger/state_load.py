"""Turning a persisted ledger state into live records, checking it on the way.

Attempt UUIDs must be unique across the whole ledger: each group's UUIDs are
checked against the ones seen in the groups before it.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.state_checks import check_group_state
from rollvault.ledger.state_convert import group_from_state
from rollvault.ledger.state_schema import GroupState, LedgerState


def records_from_state(
    state: LedgerState, *, path: str = "$"
) -> dict[str, PromptGroupRecoveryRecord]:
    """Every group of ``state`` as a live record (no runtime payload), in order."""
    records: dict[str, PromptGroupRecoveryRecord] = {}
    seen_attempt_uuids: set[uuid.UUID] = set()
    for position, raw_group in enumerate(state.groups):
        where = f"{path}.groups[{position}]"
        if raw_group.group_id in records:
            raise LedgerStateError(
                f"rollout recovery ledger state: {where}: group id "
                f"{raw_group.group_id!r} appears more than once"
            )
        records[raw_group.group_id] = group_record_from_state(
            raw_group, seen_attempt_uuids=seen_attempt_uuids, where=where
        )
    return records


def records_from_checked_state(state: LedgerState) -> dict[str, PromptGroupRecoveryRecord]:
    """Every group of ``state`` as a live record, for a state ``check_ledger_state`` accepted.

    No check runs again (group ids and attempt ids are unique, every lineage is
    one the state machines allow: the check said so).
    """
    return {record.group_id: record for record in records_of_states(state.groups)}


def records_of_states(groups: list[GroupState]) -> list[PromptGroupRecoveryRecord]:
    """Each of ``groups`` (strictly decoded) as a live record, in order, sharing nothing
    with them; the state checks are the caller's (before, or on the records).

    The records are built by one C-level conversion of all of them (the fields
    of a persisted group are a record's, an attempt's hex id becomes its UUID),
    not a Python constructor per attempt (16k at 1,024 x 16: 25 ms against 17).
    It copies every container but the values of a receipt, typed ``Any``; the
    receipts are copied in one more call.
    """
    try:
        records = msgspec.convert(groups, list[PromptGroupRecoveryRecord], from_attributes=True)
    except msgspec.ValidationError as exc:  # a decoded state converts: a bug, said plainly
        raise LedgerStateError(f"rollout recovery ledger state: {exc}") from exc
    sealed = [
        attempt
        for record in records
        for sibling in record.siblings
        for attempt in sibling.attempts
        if attempt.receipt is not None
    ]
    copies = msgspec.to_builtins([attempt.receipt for attempt in sealed])
    for attempt, receipt in zip(sealed, copies, strict=True):
        attempt.receipt = receipt
    return records


def group_record_from_state(
    raw_group: Any, *, seen_attempt_uuids: set[uuid.UUID], where: str
) -> PromptGroupRecoveryRecord:
    """Check one persisted group (a ``GroupState`` or its builtins) and build its record.

    Adds the group's attempt UUIDs to ``seen_attempt_uuids`` and raises if one
    was already there.
    """
    group = raw_group if isinstance(raw_group, GroupState) else _convert_group(raw_group, where)
    check_group_state(group, where=where, seen_attempts=set())
    located = [
        (f"{where}.siblings[{position}].attempts[{number}]", attempt.attempt_uuid)
        for position, sibling in enumerate(group.siblings)
        for number, attempt in enumerate(sibling.attempts)
    ]
    hexes = [attempt_hex for _, attempt_hex in located]
    # One C-level conversion per group instead of a Python UUID constructor per attempt.
    uuids = msgspec.convert(hexes, list[uuid.UUID])
    for (path, attempt_hex), attempt_uuid in zip(located, uuids, strict=True):
        if attempt_uuid in seen_attempt_uuids:
            raise LedgerStateError(
                f"rollout recovery ledger state: {path}.attempt_uuid (group "
                f"{group.group_id!r}): duplicate attempt UUID {attempt_hex} (already used by "
                "another group)"
            )
        seen_attempt_uuids.add(attempt_uuid)
    return group_from_state(group, dict(zip(hexes, uuids, strict=True)))


def _convert_group(raw_group: object, where: str) -> GroupState:
    try:
        return msgspec.convert(raw_group, GroupState, strict=True)
    except msgspec.ValidationError as exc:
        raise LedgerStateError(f"rollout recovery ledger state: {where}: {exc}") from exc
