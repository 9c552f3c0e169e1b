"""Giving up on unfinished attempts and minting their replacements.

The group's persisted ``recovery_granularity`` decides how much goes: with
``sibling`` only the siblings without a result; with ``prompt_group`` every
sibling of the incomplete group, sealed ones included, because its siblings
are only valid as one cohort. Callers hold the mutation cut and have checked
that the group is ``generating``.
"""

from __future__ import annotations

from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    RolloutSiblingRecord,
    new_attempts,
)
from rollvault.ledger.sealing import clear_result
from rollvault.ledger.statuses import RecoveryGranularity
from rollvault.ledger.transitions import (
    ATTEMPT_TRANSITIONS,
    GENERATING_ONLY,
    INTERRUPTED_ATTEMPT_STATUSES,
    RETRYABLE_ATTEMPT_STATUSES,
    AttemptEvent,
    check_attempt_transition,
    require_group_status,
)

_COHORT_LIVE_STATUSES = ATTEMPT_TRANSITIONS[AttemptEvent.DISCARD_COHORT].sources


def abandon_entire_group(record: PromptGroupRecoveryRecord) -> None:
    """Abandon every current attempt of an incomplete group that is still live or sealed.

    Sealed results are dropped: their staging rows become unreferenced, so
    ``expected_staging_keys`` no longer lists them and the restore inventory
    removes them. Failed and abandoned attempts stay as they are.
    """
    require_group_status(record, allowed=GENERATING_ONLY, transition="abandon the entire group")
    for index, sibling in enumerate(record.siblings):
        attempt = sibling.attempts[-1]
        if attempt.status in _COHORT_LIVE_STATUSES:
            target = check_attempt_transition(
                attempt,
                AttemptEvent.DISCARD_COHORT,
                group_id=record.group_id,
                generation_index=index,
            )
            clear_result(attempt)
            attempt.status = target


def abandon_live_siblings(record: PromptGroupRecoveryRecord) -> list[RolloutSiblingRecord]:
    """Abandon the reserved or dispatched current attempts; return their siblings."""
    abandoned = []
    for index, sibling in enumerate(record.siblings):
        attempt = sibling.attempts[-1]
        if attempt.status in INTERRUPTED_ATTEMPT_STATUSES:
            attempt.status = check_attempt_transition(
                attempt, AttemptEvent.ABANDON, group_id=record.group_id, generation_index=index
            )
            abandoned.append(sibling)
    return abandoned


def abandon_unsealed_work(record: PromptGroupRecoveryRecord) -> None:
    """Abandon failed work at the group's granularity (no replacement minted)."""
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        abandon_entire_group(record)
    else:
        abandon_live_siblings(record)


def retryable_siblings(record: PromptGroupRecoveryRecord) -> list[RolloutSiblingRecord]:
    """Siblings whose current attempt ended without a result (failed or abandoned)."""
    return [
        sibling
        for sibling in record.siblings
        if sibling.attempts[-1].status in RETRYABLE_ATTEMPT_STATUSES
    ]


def mint_fresh_attempts(siblings: list[RolloutSiblingRecord]) -> None:
    """Give each sibling a new reserved current attempt with a new UUID."""
    for sibling, attempt in zip(siblings, new_attempts(len(siblings)), strict=True):
        sibling.attempts.append(attempt)


def retry_incomplete(record: PromptGroupRecoveryRecord) -> None:
    """Mint replacements for the retryable siblings, at the group's granularity.

    The caller has checked that at least one sibling is retryable.
    """
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        abandon_entire_group(record)
        mint_fresh_attempts(record.siblings)
    else:
        mint_fresh_attempts(retryable_siblings(record))


def redo_interrupted(record: PromptGroupRecoveryRecord) -> None:
    """After a restart, replace the attempts that may have run after the snapshot.

    A ``reserved`` attempt is replaced too: the process may have dispatched it
    after the snapshot was taken, and a fresh UUID fences any late write.
    Failed or abandoned current attempts are left for the controller's retry
    policy (it counts retries against its budget).
    """
    if not any(
        sibling.attempts[-1].status in INTERRUPTED_ATTEMPT_STATUSES for sibling in record.siblings
    ):
        return
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        abandon_entire_group(record)
        mint_fresh_attempts(record.siblings)
    else:
        mint_fresh_attempts(abandon_live_siblings(record))
