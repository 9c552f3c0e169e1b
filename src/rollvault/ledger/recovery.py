"""Giving up on unfinished attempts and minting their replacements.

The group's persisted ``recovery_granularity`` decides how much goes: with
``sibling`` only the siblings without a result; with ``prompt_group`` every
sibling of the incomplete group, sealed ones included, because its siblings
are only valid as one cohort. Callers hold the mutation cut and have checked
that the group is ``generating``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgspec

from rollvault.ledger.errors import LedgerTransitionError
from rollvault.ledger.records import (
    InterruptedAttempt,
    PromptGroupRecoveryRecord,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    new_attempts,
)
from rollvault.ledger.sealing import clear_result
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from rollvault.ledger.transitions import (
    ATTEMPT_TRANSITIONS,
    GENERATING_ONLY,
    INTERRUPTED_ATTEMPT_STATUSES,
    RETRYABLE_ATTEMPT_STATUSES,
    AttemptEvent,
    check_attempt_transition,
    require_group_status,
)
from rollvault.ledger.turns import inherit_prefix

_COHORT_LIVE_STATUSES = ATTEMPT_TRANSITIONS[AttemptEvent.DISCARD_COHORT].sources
_FAIL_SOURCES, _FAIL_TARGET = ATTEMPT_TRANSITIONS[AttemptEvent.FAIL]


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
    for sibling, attempt in zip(siblings, new_attempts(len(siblings)), strict=False):
        sibling.attempts.append(attempt)  # as many attempts as siblings: no strict check


def retry_incomplete(
    record: PromptGroupRecoveryRecord, retryable: list[RolloutSiblingRecord] | None = None
) -> None:
    """Mint replacements for the retryable siblings, at the group's granularity.

    The caller has checked that at least one sibling is retryable;
    ``retryable``, when given, is ``retryable_siblings(record)`` as it found them.
    """
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        abandon_entire_group(record)
        mint_fresh_attempts(record.siblings)
    else:
        mint_fresh_attempts(retryable_siblings(record) if retryable is None else retryable)


def redo_interrupted(
    record: PromptGroupRecoveryRecord,
    redo: list[int] | None = None,
    fresh: Iterator[RolloutAttemptRecord] | None = None,
) -> None:
    """After a restart, replace the attempts that may have run after the snapshot.

    A ``reserved`` attempt is replaced too: the process may have dispatched it
    after the snapshot was taken, and a fresh UUID fences any late write. So
    is an attempt the restore has just recorded as an interrupted failure
    (:func:`record_interruption`): it stands for work that was in flight.
    Other failed or abandoned current attempts are left for the controller's
    retry policy (it counts retries against its budget). Under ``sibling``
    granularity a fresh attempt inherits the committed turns of the attempt it
    replaces (:func:`~rollvault.ledger.turns.inherit_prefix`), so a multi-turn
    episode continues at its last committed turn; ``prompt_group`` redoes the
    group whole. ``redo``, when given, is ``siblings_to_redo(record)`` as the
    caller found them. ``fresh``, when given, yields the fresh ``reserved``
    attempts of a ``sibling`` group's redone siblings (a restart mints all its
    groups' at once); a ``prompt_group`` one mints its own.
    """
    if redo is None:
        redo = siblings_to_redo(record)
    if not redo:  # nothing to redo: the record stays as it is
        return
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        abandon_entire_group(record)
        mint_fresh_attempts(record.siblings)
        return
    # One pass over the siblings to redo (a restore redoes ~8k): each live current
    # attempt is abandoned (as abandon_live_siblings would: every live one is among
    # them, and the edge exists from both live statuses, so no refusal can leave a
    # sibling half done), and the fresh attempt continues the episode at the replaced
    # attempt's last committed turn.
    siblings = record.siblings
    if fresh is None:
        fresh = iter(new_attempts(len(redo)))
    for index in redo:
        attempts = siblings[index].attempts
        previous = attempts[-1]
        if previous.status in INTERRUPTED_ATTEMPT_STATUSES:
            previous.status = check_attempt_transition(
                previous, AttemptEvent.ABANDON, group_id=record.group_id, generation_index=index
            )
        attempt = next(fresh)
        inherit_prefix(previous, attempt)
        attempts.append(attempt)


def siblings_to_redo(record: PromptGroupRecoveryRecord) -> list[int]:
    """The indices of the siblings whose current attempt a restart replaces
    (:func:`_redo_on_restart`, inlined: a restart asks it of every sibling)."""
    failed = RolloutAttemptStatus.FAILED
    redo = []
    for index, sibling in enumerate(record.siblings):
        attempt = sibling.attempts[-1]
        if attempt.status in INTERRUPTED_ATTEMPT_STATUSES or (
            attempt.status is failed and attempt.failure_kind is AttemptFailureKind.INTERRUPTED
        ):
            redo.append(index)
    return redo


def _redo_on_restart(attempt: RolloutAttemptRecord) -> bool:
    """Whether a restart replaces ``attempt``, its sibling's current one."""
    return attempt.status in INTERRUPTED_ATTEMPT_STATUSES or (
        attempt.status is RolloutAttemptStatus.FAILED
        and attempt.failure_kind is AttemptFailureKind.INTERRUPTED
    )


def record_interruption(record: PromptGroupRecoveryRecord, interrupted: InterruptedAttempt) -> None:
    """Record that ``interrupted`` was in flight when the controller process died.

    When it is the sibling's current attempt (``reserved`` or ``dispatched``
    in the snapshot), it fails with kind ``interrupted``; a ``reserved`` one
    is dispatched first, as the dispatch journal saw it dispatched. Otherwise
    it was minted after the snapshot: the attempt it superseded ended then,
    with an outcome the process took with it, and is abandoned (a sealed one
    only under ``prompt_group``, whose retries discard the cohort); the
    interrupted attempt is appended, failed, carrying the superseded attempt's
    committed turns when a restart would have continued that attempt (``sibling``
    granularity): the restart continues them instead.
    Callers hold the cut and have checked that the group is ``generating``.
    Changes nothing when it raises.
    """
    index = interrupted.generation_index
    sibling = record.siblings[index]
    current = sibling.attempts[-1]
    # Identity first: a restore's crash evidence hands over the current attempt's own
    # UUID object (~8k per restore), and UUID equality is a Python-level call.
    if current.attempt_uuid is interrupted.attempt_uuid or (
        current.attempt_uuid == interrupted.attempt_uuid
    ):
        _fail_interrupted(record, index, current, interrupted.reason)
        return
    if any(attempt.attempt_uuid == interrupted.attempt_uuid for attempt in sibling.attempts):
        raise _already_superseded(record, index, interrupted)
    # Only an attempt a restart would continue hands its committed turns on: one live at
    # the snapshot, or one this restore has just recorded as interrupted (the journal
    # saw it dispatched, then this one minted by a restart that died before a snapshot).
    # One that had failed by the snapshot was retried from its first turn.
    continues = record.recovery_granularity is RecoveryGranularity.SIBLING and _redo_on_restart(
        current
    )
    event = AttemptEvent.ABANDON
    if current.status is RolloutAttemptStatus.SEALED:
        event = AttemptEvent.DISCARD_COHORT
        if record.recovery_granularity is not RecoveryGranularity.PROMPT_GROUP:
            raise _already_superseded(record, index, interrupted)
    if current.status not in RETRYABLE_ATTEMPT_STATUSES:
        target = check_attempt_transition(
            current, event, group_id=record.group_id, generation_index=index
        )
        clear_result(current)
        current.status = target
    failed = interrupted.failed_record()
    if continues:
        # What the restored state holds of the episode is the superseded attempt's
        # committed turns (the work after the snapshot went with the process), and the
        # restart's fresh attempt inherits them from this record: without them a sibling
        # killed again after a restart began over at its first turn, its committed prefix
        # dropped as orphan rows, though the first restart had continued it.
        inherit_prefix(current, failed)
    sibling.attempts.append(failed)


def record_interruptions(
    record: PromptGroupRecoveryRecord,
    interrupted: Sequence[InterruptedAttempt],
    *,
    undo: bool = True,
) -> None:
    """:func:`record_interruption` of each item in order; changes nothing when it raises.

    An item may depend on the one before it (a sibling's snapshot attempt,
    then the attempts minted after it), so they are applied in turn; what
    they change is only each touched sibling's attempt list and its current
    attempt, and a refusal puts both back as they were. ``undo=False``: the
    caller drops ``record`` when this raises (a copy it has not installed
    yet), so nothing is saved to put back (a restore records thousands).
    """
    if not undo:
        for item in interrupted:
            record_interruption(record, item)
        return
    saved: dict[int, tuple[RolloutSiblingRecord, list[RolloutAttemptRecord]]] = {}
    try:
        for item in interrupted:
            index = item.generation_index
            if index not in saved:
                sibling = record.siblings[index]
                attempts = sibling.attempts
                # A shallow copy of the current attempt: a refusal's undo. Its
                # fields are replaced, never mutated in place, by the changes.
                saved[index] = (sibling, [*attempts[:-1], msgspec.structs.replace(attempts[-1])])
            record_interruption(record, item)
    except BaseException:
        for sibling, attempts in saved.values():
            sibling.attempts[:] = attempts
        raise


def _fail_interrupted(
    record: PromptGroupRecoveryRecord, index: int, attempt: RolloutAttemptRecord, reason: str
) -> None:
    # reserved -> dispatched -> failed: both edges exist, and the second cannot
    # fail once the first succeeded, so a refusal changes nothing.
    if attempt.status is RolloutAttemptStatus.RESERVED:
        attempt.status = check_attempt_transition(
            attempt, AttemptEvent.DISPATCH, group_id=record.group_id, generation_index=index
        )
    # The table's edge, read once: a restore fails ~8k dispatched attempts here, and
    # the check is called only to raise its refusal.
    if attempt.status in _FAIL_SOURCES:
        attempt.status = _FAIL_TARGET
    else:  # raises: the status has no fail edge
        check_attempt_transition(
            attempt, AttemptEvent.FAIL, group_id=record.group_id, generation_index=index
        )
    attempt.failure_reason = reason
    attempt.failure_kind = AttemptFailureKind.INTERRUPTED


def _already_superseded(
    record: PromptGroupRecoveryRecord, index: int, interrupted: InterruptedAttempt
) -> LedgerTransitionError:
    sibling = record.siblings[index]
    return LedgerTransitionError(
        f"group {record.group_id!r} sibling {index}: cannot record attempt "
        f"{interrupted.attempt_uuid.hex} as interrupted: the sibling's lineage "
        f"({[(a.attempt_uuid.hex, a.status.value) for a in sibling.attempts]}) already "
        "supersedes it, or cannot have been retried after the snapshot",
        group_id=record.group_id,
        transition="record interruption",
        status=sibling.attempts[-1].status.value,
        generation_index=index,
        attempt_id=interrupted.attempt_uuid.hex,
    )


def carry_interruptions(
    record: PromptGroupRecoveryRecord, interrupted: Sequence[InterruptedAttempt]
) -> None:
    """Put interrupted attempts of an earlier, lost group of this prompt into its lineage.

    A group reserved after the snapshot a restore used is lost with the
    process; when its prompt is reserved again, its interrupted attempts
    become failed attempts of the new group's siblings, before each
    sibling's first (``reserved``, never dispatched) attempt, so that they
    count against its budget. Callers hold the cut. Changes nothing when it
    raises.
    """
    for item in interrupted:
        sibling = record.siblings[item.generation_index]
        if sibling.attempts[-1].status is not RolloutAttemptStatus.RESERVED or any(
            attempt.attempt_uuid == item.attempt_uuid for attempt in sibling.attempts
        ):
            raise _already_superseded(record, item.generation_index, item)
    for item in interrupted:
        attempts = record.siblings[item.generation_index].attempts
        attempts.insert(len(attempts) - 1, item.failed_record())
