"""Semantic checks of a persisted ledger state, beyond what its types say.

The strict decoder guarantees shapes and types; these checks guarantee that
the lineage is one the ledger's state machines could have produced, so a
restore never starts from an impossible state. Every message names the JSON
path and the group, sibling and attempt it is about.

Attempt-level checks raise a location-free ``_Problem``; the group loop adds
the location. Restore checks tens of thousands of attempts, so nothing is
formatted unless something is wrong.

The checks read a group's fields by name, so they run on either form of a
group: the persisted state (:class:`~rollvault.ledger.state_schema.GroupState`,
attempt ids as hex) or the live record a restore builds straight from a
ledger segment's pieces (:class:`~rollvault.ledger.records.PromptGroupRecoveryRecord`,
attempt ids as UUIDs), with the same rules and the same messages.

A rule added here needs its twin in the screen a restore runs while it builds a
ledger segment's records (:func:`~rollvault.ledger.packed_groups.screened_group_records`):
a ledger the screen clears skips these checks. The screen may only clear what
these accept (``tests/pipeline/test_checked_groups.py`` spoils valid groups one
rule at a time to hold it to that), never refuse: its doubts come back here for
the message.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from rollvault.ledger.errors import InvalidReceiptError, LedgerStateError
from rollvault.ledger.receipts import GateReceipt, check_receipt_semantics
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.state_schema import AttemptState, GroupState, LedgerState, SiblingState
from rollvault.ledger.statuses import PromptGroupPhase, PromptGroupStatus, RolloutAttemptStatus
from rollvault.ledger.transitions import ALL_SEALED_STATUSES, RETRYABLE_ATTEMPT_STATUSES

_SEALED = RolloutAttemptStatus.SEALED
_FAILED = RolloutAttemptStatus.FAILED
# Before admission nothing may have been dispatched (dispatch requires admission).
_PRE_ADMISSION_ATTEMPT_STATUSES = frozenset(
    {RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.ABANDONED}
)
_RESULT_FIELDS = ("receipt", "reward", "mask_sample", "reward_checks", "reward_log_context")


class _Problem(Exception):
    """What is wrong with one attempt, and in which of its fields."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _fail(where: str, message: str, *, label: str = "") -> LedgerStateError:
    """An error at JSON path ``where``; ``label`` names the group/sibling/attempt it is about."""
    about = f" ({label})" if label else ""
    return LedgerStateError(f"rollout recovery ledger state: {where}{about}: {message}")


_Group = GroupState | PromptGroupRecoveryRecord
_Attempt = AttemptState | RolloutAttemptRecord


def check_ledger_state(state: LedgerState, *, path: str = "$") -> None:
    """Check every group of ``state`` and the uniqueness rules across groups."""
    check_ledger_groups(state.groups, path=f"{path}.groups")


def check_ledger_groups(groups: Sequence[_Group], *, path: str) -> None:
    """Check every group of a ledger (``path``: where its list of groups is, as
    ``"$.ledger.groups"``) and the uniqueness rules across groups."""
    seen_groups: set[str] = set()
    seen_attempts: set[str | int] = set()
    for position, group in enumerate(groups):
        where = f"{path}[{position}]"
        if group.group_id in seen_groups:
            raise _fail(where, f"group id {group.group_id!r} appears more than once")
        seen_groups.add(group.group_id)
        check_group_state(group, where=where, seen_attempts=seen_attempts)


def check_group_state(group: _Group, *, where: str, seen_attempts: set[str | int]) -> None:
    """Check one group; adds its attempt ids to ``seen_attempts`` (ledger-wide uniqueness:
    a state's as hex, a record's as its UUID's int)."""
    group_id = group.group_id
    if len(group.siblings) != group.expected_generations:
        raise _fail(
            f"{where}.expected_generations",
            f"expected_generations is {group.expected_generations} but the group has "
            f"{len(group.siblings)} siblings",
            label=f"group {group_id!r}",
        )
    before_admission = group.phase is PromptGroupPhase.RESERVED
    unsealed: tuple[int, _Attempt] | None = None
    siblings: Sequence[SiblingState | RolloutSiblingRecord] = group.siblings
    for position, sibling in enumerate(siblings):
        if sibling.generation_index != position:
            raise _fail(
                f"{where}.siblings[{position}].generation_index",
                f"non-contiguous generation indices: generation_index is "
                f"{sibling.generation_index}, expected {position} (siblings are 0..N-1 in order)",
                label=f"group {group_id!r}",
            )
        attempts: Sequence[_Attempt] = sibling.attempts
        last = len(attempts) - 1
        for number, attempt in enumerate(attempts):
            attempt_id = attempt.attempt_uuid
            try:
                _check_attempt(
                    attempt,
                    attempt_id,
                    group_id=group_id,
                    position=position,
                    current=number == last,
                    before_admission=before_admission,
                    seen_attempts=seen_attempts,
                )
            except _Problem as problem:
                raise _fail(
                    f"{where}.siblings[{position}].attempts[{number}].{problem.field}",
                    problem.message,
                    label=f"group {group_id!r} sibling {position} attempt {_hex(attempt_id)}",
                ) from None
        if unsealed is None and attempts[last].status is not _SEALED:
            unsealed = (position, attempts[last])
    _check_group_status(group, where=where, unsealed=unsealed)


def _check_group_status(
    group: _Group, *, where: str, unsealed: tuple[int, _Attempt] | None
) -> None:
    status = group.status
    label = f"group {group.group_id!r}"
    if status is PromptGroupStatus.GENERATING and unsealed is None:
        raise _fail(
            f"{where}.status",
            "status 'generating' contradicts its siblings: every current attempt is sealed, "
            "so the group is 'ready_to_finalize' or later",
            label=label,
        )
    if status in ALL_SEALED_STATUSES and unsealed is not None:
        position, attempt = unsealed
        raise _fail(
            f"{where}.status",
            f"status {status.value!r} contradicts sibling {position}, whose current attempt "
            f"{_hex(attempt.attempt_uuid)} is {attempt.status.value!r} (every current attempt must "
            "be sealed)",
            label=label,
        )
    if group.phase is PromptGroupPhase.RESERVED and status is not PromptGroupStatus.GENERATING:
        raise _fail(
            f"{where}.status",
            f"status {status.value!r} contradicts the group's phase 'reserved'",
            label=label,
        )


def _hex(attempt_id: str | uuid.UUID) -> str:
    """An attempt's id as persisted (32 hex digits): a state's as is, a record's UUID's hex."""
    return attempt_id if isinstance(attempt_id, str) else attempt_id.hex


def _check_attempt(
    attempt: _Attempt,
    attempt_id: str | uuid.UUID,
    *,
    group_id: str,
    position: int,
    current: bool,
    before_admission: bool,
    seen_attempts: set[str | int],
) -> None:
    # A record's UUID is told apart by its int (a slot, hashed in C; its hex is a
    # Python property): one form per ledger, so an int never meets a hex string.
    key = attempt_id if isinstance(attempt_id, str) else attempt_id.int
    if key in seen_attempts:
        raise _Problem(
            "attempt_uuid", f"duplicate attempt UUID {_hex(attempt_id)} (already used above)"
        )
    seen_attempts.add(key)
    status = attempt.status
    if not current and status not in RETRYABLE_ATTEMPT_STATUSES:
        raise _Problem(
            "status",
            f"a superseded attempt must be 'failed' or 'abandoned', not {status.value!r} "
            "(only the current attempt may be live or sealed)",
        )
    if before_admission and status not in _PRE_ADMISSION_ATTEMPT_STATUSES:
        raise _Problem(
            "status",
            f"attempt status {status.value!r} contradicts the group's phase 'reserved': a "
            "group is dispatched only after admission",
        )
    if status is _SEALED:
        _check_sealed(attempt, gate_rollout_id=f"{group_id}_g{position}_a{_hex(attempt_id)}")
    else:
        _check_unsealed(attempt)


def _gate_receipt(fields: dict[str, Any]) -> GateReceipt:
    """``fields`` as a Gate receipt. A refusal names the first problem in key order:
    msgspec stops at the first bad key in the dict's own order, and a form 3 segment
    stores a receipt kept as a dict with its keys sorted, so the same ledger read from
    a segment and from a state must not give two messages (sorted only on a refusal)."""
    try:
        return msgspec.convert(fields, GateReceipt, strict=True)
    except msgspec.ValidationError:
        in_order = dict(sorted(fields.items(), key=lambda item: str(item[0])))
        return msgspec.convert(in_order, GateReceipt, strict=True)


def _check_sealed(attempt: _Attempt, *, gate_rollout_id: str) -> None:
    if attempt.receipt is None:
        raise _Problem("receipt", "a sealed attempt needs a receipt, got null")
    if attempt.mask_sample is None:
        raise _Problem("mask_sample", "a sealed attempt needs a mask_sample, got null")
    reward = attempt.reward
    if reward is None:
        raise _Problem("reward", "a sealed attempt needs a reward, got null")
    if not math.isfinite(reward):
        raise _Problem("reward", f"reward must be finite, got {reward!r}")
    try:
        receipt = _gate_receipt(attempt.receipt)
        check_receipt_semantics(receipt, where="receipt")
    except (msgspec.ValidationError, InvalidReceiptError) as exc:
        raise _Problem("receipt", f"invalid Gate receipt: {exc}") from None
    if receipt.gate_rollout_id != gate_rollout_id:
        raise _Problem(
            "receipt.gate_rollout_id",
            f"{receipt.gate_rollout_id!r} is not this attempt's gate rollout id {gate_rollout_id!r}",
        )
    if receipt.staging_keys != attempt.staging_keys:
        raise _Problem(
            "staging_keys",
            f"{attempt.staging_keys!r} differ from the receipt's staging_keys "
            f"{receipt.staging_keys!r}",
        )
    if receipt.reward is not None and receipt.reward != reward:
        raise _Problem("reward", f"{reward!r} differs from the receipt's reward {receipt.reward!r}")
    if attempt.failure_reason is not None:
        raise _Problem("failure_reason", "a sealed attempt has no failure_reason")
    if attempt.failure_kind is not None:
        raise _Problem("failure_kind", "a sealed attempt has no failure_kind")


def _check_unsealed(attempt: _Attempt) -> None:
    # The status's text only for a message: an enum's ``.value`` is a Python-level
    # descriptor, and a restore checks ~8.5k unsealed attempts that pass.
    if not (
        attempt.receipt is None
        and attempt.reward is None
        and attempt.mask_sample is None
        and attempt.reward_checks is None
        and attempt.reward_log_context is None
    ):
        name = next(name for name in _RESULT_FIELDS if getattr(attempt, name) is not None)
        raise _Problem(
            name,
            f"only a sealed attempt carries a {name}; this attempt is {attempt.status.value!r}",
        )
    if attempt.staging_keys:
        raise _Problem(
            "staging_keys",
            f"only a sealed attempt owns staging keys; this attempt is {attempt.status.value!r}",
        )
    if attempt.status is _FAILED:
        if not attempt.failure_reason:
            raise _Problem("failure_reason", "a failed attempt needs a non-empty reason")
        if attempt.failure_kind is None:
            raise _Problem("failure_kind", "a failed attempt needs a failure_kind")
    elif attempt.failure_reason is not None:
        raise _Problem(
            "failure_reason",
            "only a failed attempt carries a failure_reason; this attempt is "
            f"{attempt.status.value!r}",
        )
    elif attempt.failure_kind is not None:
        raise _Problem(
            "failure_kind",
            "only a failed attempt carries a failure_kind; this attempt is "
            f"{attempt.status.value!r}",
        )
