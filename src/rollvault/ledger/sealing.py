"""Recording a sibling's terminal result: fencing, validation and the seal.

Split in check and apply so that a whole cohort can be checked before any of
it is applied (``mark_group_sealed`` is atomic).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from rollvault.ledger.arguments import require_bool, require_finite_float
from rollvault.ledger.errors import (
    InvalidLedgerInputError,
    InvalidReceiptError,
    SealConflictError,
    StaleAttemptError,
)
from rollvault.ledger.receipts import GateReceipt, validate_receipt
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.statuses import RolloutAttemptStatus

_convert = msgspec.convert
_to_builtins = msgspec.to_builtins
_isfinite = math.isfinite


class SealValues(msgspec.Struct, frozen=True):
    """A checked, normalised terminal result, ready to be applied to an attempt.

    A Struct, not a NamedTuple: one is built per seal, and a Struct's
    constructor (C) costs a quarter of a NamedTuple's (Python).
    """

    receipt: dict[str, Any]
    staging_keys: list[str]
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None
    reward_log_context: RewardLogContext | None


def fenced_attempt(
    record: PromptGroupRecoveryRecord, generation_index: int, gate_rollout_id: object
) -> RolloutAttemptRecord:
    """The sibling's current attempt, if ``gate_rollout_id`` names it; else raise.

    A result from a superseded attempt (a retry minted a new UUID) is refused.
    """
    attempt = record.siblings[generation_index].attempts[-1]
    expected = f"{record.group_id}_g{generation_index}_a{attempt.attempt_uuid.hex}"
    if gate_rollout_id != expected:
        raise StaleAttemptError(
            f"group {record.group_id!r} sibling {generation_index}: gate rollout id "
            f"{gate_rollout_id!r} is not the current attempt's {expected!r} (current attempt "
            f"{attempt.attempt_uuid.hex} is {attempt.status.value!r}); a result from a "
            "superseded attempt is refused"
        )
    return attempt


def seal_values(
    record: PromptGroupRecoveryRecord,
    generation_index: int,
    attempt: RolloutAttemptRecord,
    *,
    gate_rollout_id: str,
    receipt: object,
    reward: object,
    mask_sample: object,
    reward_checks: object,
    reward_log_context: object,
) -> SealValues:
    """Check one terminal result for ``attempt`` and return it normalised.

    ``gate_rollout_id`` is the attempt's gate rollout id, already fenced. The
    checks run in the order of their messages (receipt, its gate id, reward,
    the reward records, mask flag); each exact-type fast path falls back to
    the general check, which normalises or raises with the message.
    """
    try:
        typed = _typed_receipt(receipt)
        if typed.gate_rollout_id != gate_rollout_id:
            raise InvalidReceiptError(
                f"receipt gate_rollout_id {typed.gate_rollout_id!r} is not the attempt's "
                f"gate rollout id {gate_rollout_id!r}"
            )
        if type(reward) is float and _isfinite(reward):
            reward_value = reward
        else:
            reward_value = require_finite_float(reward, name="reward", where="seal")
        if typed.reward is not None and typed.reward != reward_value:
            raise InvalidReceiptError(
                f"receipt reward {typed.reward!r} differs from reward {reward_value!r}"
            )
        if reward_checks is not None and not isinstance(reward_checks, RewardChecks):
            raise InvalidLedgerInputError(
                f"reward_checks must be RewardChecks or None, got {type(reward_checks).__name__}"
            )
        if reward_log_context is not None and not isinstance(reward_log_context, RewardLogContext):
            raise InvalidLedgerInputError(
                "reward_log_context must be RewardLogContext or None, got "
                f"{type(reward_log_context).__name__}"
            )
        mask_value = (
            mask_sample
            if type(mask_sample) is bool
            else require_bool(mask_sample, name="mask_sample", where="seal")
        )
    except InvalidLedgerInputError as exc:
        # The location is formatted only on failure: sealing is the hot path.
        where = (
            f"group {record.group_id!r} sibling {generation_index} "
            f"attempt {attempt.attempt_uuid.hex}"
        )
        raise type(exc)(f"{where}: {exc}") from exc
    # ``typed`` was built by ``convert`` (fresh lists) and the stored receipt by
    # ``to_builtins`` (fresher still): neither aliases the caller's receipt nor
    # each other, so the typed staging keys need no further copy.
    return SealValues(
        _to_builtins(typed),
        typed.staging_keys,
        reward_value,
        mask_value,
        reward_checks,
        reward_log_context,
    )


def _typed_receipt(receipt: object) -> GateReceipt:
    """``validate_receipt`` with the checks of a well-formed receipt inlined.

    A receipt that fails any of them is handed to ``validate_receipt``, which
    raises with the full message, so errors are exactly its errors.
    """
    if type(receipt) is not dict:
        return validate_receipt(receipt)  # raises with the message
    try:
        typed = _convert(receipt, GateReceipt, strict=True)
    except msgspec.ValidationError:
        return validate_receipt(receipt)  # raises with the message
    keys = typed.staging_keys
    digests = typed.row_digests
    if (
        (len(keys) == 1 or len(set(keys)) == len(keys))
        and (digests is None or len(digests) == len(keys))
        and (typed.reward is None or _isfinite(typed.reward))
    ):
        return typed
    return validate_receipt(receipt)  # raises with the message


def check_same_seal(
    record: PromptGroupRecoveryRecord,
    generation_index: int,
    attempt: RolloutAttemptRecord,
    values: SealValues,
) -> None:
    """Accept a repeated seal of a sealed attempt only when it is identical."""
    differing = [
        name
        for name in SealValues.__struct_fields__
        if getattr(attempt, name) != getattr(values, name)
    ]
    if differing:
        raise SealConflictError(
            f"group {record.group_id!r} sibling {generation_index} attempt "
            f"{attempt.attempt_uuid.hex} is already sealed with a different "
            f"{', '.join(differing)}; a sealed result is never replaced"
        )


def apply_seal(attempt: RolloutAttemptRecord, values: SealValues) -> None:
    """Record ``values`` on ``attempt`` and mark it sealed (transition already checked)."""
    attempt.receipt = values.receipt
    attempt.staging_keys = values.staging_keys
    attempt.reward = values.reward
    attempt.mask_sample = values.mask_sample
    attempt.reward_checks = values.reward_checks
    attempt.reward_log_context = values.reward_log_context
    attempt.status = RolloutAttemptStatus.SEALED


def clear_result(attempt: RolloutAttemptRecord) -> None:
    """Drop a discarded sealed result: only a sealed attempt carries one."""
    attempt.receipt = None
    attempt.staging_keys = []
    attempt.reward = None
    attempt.mask_sample = None
    attempt.reward_checks = None
    attempt.reward_log_context = None
