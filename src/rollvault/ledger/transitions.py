"""The ledger's state machines, as data, and the one checked step of each.

Three machines, each a table from event to (allowed source states, target):

- attempt: ``reserved -> dispatched -> sealed | failed | abandoned`` and
  ``reserved -> abandoned`` (an attempt interrupted before dispatch). The one
  further edge, ``sealed -> abandoned``, belongs to a single event,
  ``discard_cohort``: a ``prompt_group`` group is atomic, so when it is
  incomplete its sealed siblings are thrown away with the rest (their staging
  rows become unreferenced). No other event reaches a sealed attempt.
- group: ``generating -> ready_to_finalize`` (when every sibling's current
  attempt is sealed) ``-> finalizing -> discarded`` (the group leaves the
  ledger, allowed from ``DISCARDABLE_STATUSES``) or
  ``finalizing -> finalization_unknown``, which either finalizes again or is
  discarded.
- phase: ``reserved -> admitted``.

A check function returns the target state or raises
:class:`~rollvault.ledger.errors.LedgerTransitionError`; it never changes
anything, so a caller can check a whole cohort before applying any of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final, NamedTuple

from rollvault.ledger.errors import LedgerTransitionError
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.statuses import PromptGroupPhase, PromptGroupStatus, RolloutAttemptStatus

_A = RolloutAttemptStatus
_G = PromptGroupStatus


class AttemptEvent(StrEnum):
    """What can happen to one attempt."""

    DISPATCH = "dispatch"
    SEAL = "seal"
    FAIL = "fail"
    ABANDON = "abandon"
    DISCARD_COHORT = "discard_cohort"


class GroupEvent(StrEnum):
    """What can happen to one prompt group's status."""

    ALL_SIBLINGS_SEALED = "all_siblings_sealed"
    START_FINALIZATION = "start_finalization"
    FINALIZATION_UNKNOWN = "finalization_unknown"


class PhaseEvent(StrEnum):
    """What can happen to one prompt group's admission phase."""

    ADMIT = "admit"


class AttemptTransition(NamedTuple):
    sources: frozenset[RolloutAttemptStatus]
    target: RolloutAttemptStatus


class GroupTransition(NamedTuple):
    sources: frozenset[PromptGroupStatus]
    target: PromptGroupStatus


class PhaseTransition(NamedTuple):
    sources: frozenset[PromptGroupPhase]
    target: PromptGroupPhase


ATTEMPT_TRANSITIONS: Final[Mapping[AttemptEvent, AttemptTransition]] = MappingProxyType(
    {
        AttemptEvent.DISPATCH: AttemptTransition(frozenset({_A.RESERVED}), _A.DISPATCHED),
        AttemptEvent.SEAL: AttemptTransition(frozenset({_A.DISPATCHED}), _A.SEALED),
        AttemptEvent.FAIL: AttemptTransition(frozenset({_A.DISPATCHED}), _A.FAILED),
        AttemptEvent.ABANDON: AttemptTransition(
            frozenset({_A.RESERVED, _A.DISPATCHED}), _A.ABANDONED
        ),
        AttemptEvent.DISCARD_COHORT: AttemptTransition(
            frozenset({_A.RESERVED, _A.DISPATCHED, _A.SEALED}), _A.ABANDONED
        ),
    }
)

GROUP_TRANSITIONS: Final[Mapping[GroupEvent, GroupTransition]] = MappingProxyType(
    {
        GroupEvent.ALL_SIBLINGS_SEALED: GroupTransition(
            frozenset({_G.GENERATING}), _G.READY_TO_FINALIZE
        ),
        GroupEvent.START_FINALIZATION: GroupTransition(
            frozenset({_G.READY_TO_FINALIZE, _G.FINALIZATION_UNKNOWN}), _G.FINALIZING
        ),
        GroupEvent.FINALIZATION_UNKNOWN: GroupTransition(
            frozenset({_G.FINALIZING}), _G.FINALIZATION_UNKNOWN
        ),
    }
)

# Statuses from which a group may leave the ledger: the controller has published
# (or confirmed) its canonical rows and cleaned its staging rows.
DISCARDABLE_STATUSES: Final = frozenset({_G.FINALIZING, _G.FINALIZATION_UNKNOWN})

PHASE_TRANSITIONS: Final[Mapping[PhaseEvent, PhaseTransition]] = MappingProxyType(
    {
        PhaseEvent.ADMIT: PhaseTransition(
            frozenset({PromptGroupPhase.RESERVED}), PromptGroupPhase.ADMITTED
        ),
    }
)

# Group statuses in which sibling work (dispatch, seal, fail, abandon, retry) may change.
GENERATING_ONLY: Final = frozenset({_G.GENERATING})
# Group statuses in which every sibling's current attempt is sealed.
ALL_SEALED_STATUSES: Final = frozenset(
    {_G.READY_TO_FINALIZE, _G.FINALIZING, _G.FINALIZATION_UNKNOWN}
)
# Live current attempts: still to generate or generating. A live attempt owns its
# committed turns' rows (``expected_staging_keys``).
LIVE_ATTEMPT_STATUSES: Final = frozenset({_A.RESERVED, _A.DISPATCHED})
# Current attempts that a restart interrupted (the live ones): they may have run after
# the snapshot.
INTERRUPTED_ATTEMPT_STATUSES: Final = LIVE_ATTEMPT_STATUSES
# Current attempts that end a sibling's try without a result and call for a retry.
RETRYABLE_ATTEMPT_STATUSES: Final = frozenset({_A.FAILED, _A.ABANDONED})


def _names(states: Iterable[StrEnum]) -> str:
    return ", ".join(sorted(state.value for state in states)) or "nowhere"


def check_attempt_transition(
    attempt: RolloutAttemptRecord,
    event: AttemptEvent,
    *,
    group_id: str,
    generation_index: int,
) -> RolloutAttemptStatus:
    """Return the status ``event`` moves ``attempt`` to, or raise; changes nothing."""
    sources, target = ATTEMPT_TRANSITIONS[event]
    status = attempt.status
    if status in sources:
        return target
    raise LedgerTransitionError(
        f"group {group_id!r} sibling {generation_index} attempt {attempt.attempt_uuid.hex}: "
        f"cannot {event.value} an attempt in status {status.value!r} "
        f"(-> {target.value!r} is allowed only from: {_names(sources)})",
        group_id=group_id,
        transition=event.value,
        status=status.value,
        generation_index=generation_index,
        attempt_id=attempt.attempt_uuid.hex,
    )


def check_group_transition(
    record: PromptGroupRecoveryRecord, event: GroupEvent
) -> PromptGroupStatus:
    """Return the status ``event`` moves the group to, or raise; changes nothing."""
    sources, target = GROUP_TRANSITIONS[event]
    require_group_status(record, allowed=sources, transition=event.value)
    return target


def check_phase_transition(
    record: PromptGroupRecoveryRecord, event: PhaseEvent
) -> PromptGroupPhase:
    """Return the phase ``event`` moves the group to, or raise; changes nothing."""
    sources, target = PHASE_TRANSITIONS[event]
    if record.phase in sources:
        return target
    raise LedgerTransitionError(
        f"group {record.group_id!r}: cannot {event.value} a group in phase "
        f"{record.phase.value!r} (allowed only from phase: {_names(sources)})",
        group_id=record.group_id,
        transition=event.value,
        status=record.phase.value,
    )


def require_group_status(
    record: PromptGroupRecoveryRecord,
    *,
    allowed: frozenset[PromptGroupStatus] | set[PromptGroupStatus],
    transition: str,
    generation_index: int | None = None,
    attempt: RolloutAttemptRecord | None = None,
) -> None:
    """Raise unless the group's status is one of ``allowed`` for ``transition``.

    ``generation_index`` and ``attempt`` name the sibling and attempt in the
    message when the operation concerns one.
    """
    status = record.status
    if status in allowed:
        return
    attempt_id = None if attempt is None else attempt.attempt_uuid.hex
    where = f"group {record.group_id!r}"
    if generation_index is not None:
        where += f" sibling {generation_index}"
    if attempt_id is not None:
        where += f" attempt {attempt_id}"
    raise LedgerTransitionError(
        f"{where}: cannot {transition} while the group is {status.value!r} "
        f"(allowed only while the group is: {_names(allowed)})",
        group_id=record.group_id,
        transition=transition,
        status=status.value,
        generation_index=generation_index,
        attempt_id=attempt_id,
    )


def require_phase(
    record: PromptGroupRecoveryRecord,
    *,
    allowed: frozenset[PromptGroupPhase],
    transition: str,
) -> None:
    """Raise unless the group's admission phase is one of ``allowed``."""
    if record.phase in allowed:
        return
    raise LedgerTransitionError(
        f"group {record.group_id!r}: cannot {transition} while the group is in phase "
        f"{record.phase.value!r} (allowed only in phase: {_names(allowed)}); "
        "mark_group_admitted() commits the sampler's admission first",
        group_id=record.group_id,
        transition=transition,
        status=record.phase.value,
    )
