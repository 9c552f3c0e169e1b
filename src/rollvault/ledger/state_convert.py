"""Conversion between the live records and their persisted form.

Unchecked by design: the ledger's transitions guarantee that live records
are valid, and :mod:`rollvault.ledger.state_checks` checks a persisted state
before it is turned into records.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from typing import TypeVar

import msgspec

from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.state_schema import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    AttemptState,
    GroupHeaderState,
    GroupState,
    LedgerState,
    PromptRefState,
    SiblingState,
)

_Header = TypeVar("_Header", bound=GroupHeaderState)


def ledger_to_state(
    records: Iterable[PromptGroupRecoveryRecord], *, exclude: Collection[str] = ()
) -> LedgerState:
    """The persisted form of a ledger's groups, leaving out the ids in ``exclude``."""
    return LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(record) for record in records if record.group_id not in exclude],
    )


def group_to_state(record: PromptGroupRecoveryRecord) -> GroupState:
    """The persisted form of ``record``; the runtime prompt payload is left out.

    Containers are shared with the record: encode (``msgspec.to_builtins``)
    before the record can change.
    """
    # The header's fields and the siblings: ``GroupState``'s own field order
    # (not the keywords') fixes the encoded order.
    return GroupState(
        **msgspec.structs.asdict(group_header_to_state(record)),
        siblings=[
            SiblingState(
                generation_index=sibling.generation_index,
                attempts=[_attempt_to_state(attempt) for attempt in sibling.attempts],
            )
            for sibling in record.siblings
        ],
    )


def _attempt_to_state(attempt: RolloutAttemptRecord) -> AttemptState:
    return AttemptState(
        attempt_uuid=attempt.attempt_uuid.hex,
        status=attempt.status,
        receipt=attempt.receipt,
        reward=attempt.reward,
        mask_sample=attempt.mask_sample,
        reward_checks=attempt.reward_checks,
        reward_log_context=attempt.reward_log_context,
        staging_keys=attempt.staging_keys,
        failure_reason=attempt.failure_reason,
        failure_kind=attempt.failure_kind,
        turn_keys=list(attempt.turn_keys),
        env_state_revision=attempt.env_state_revision,
    )


def group_from_state(
    state: GroupState, attempt_uuids: dict[str, uuid.UUID]
) -> PromptGroupRecoveryRecord:
    """A live record (without runtime payload) from a checked persisted group.

    ``attempt_uuids`` maps each attempt's hex id to its UUID object (built in
    one batch by the caller).
    """
    return PromptGroupRecoveryRecord(
        group_id=state.group_id,
        admission_id=state.admission_id,
        prompt_id=state.prompt_id,
        prompt_ref=PromptRef(
            sample_id=state.prompt_ref.sample_id, task_name=state.prompt_ref.task_name
        ),
        task_source=state.task_source,
        recovery_granularity=state.recovery_granularity,
        runtime_prompt_payload=None,
        expected_generations=state.expected_generations,
        target_step=state.target_step,
        start_weight_version=state.start_weight_version,
        siblings=[
            RolloutSiblingRecord(
                generation_index=sibling.generation_index,
                attempts=[
                    _attempt_from_state(attempt, attempt_uuids[attempt.attempt_uuid])
                    for attempt in sibling.attempts
                ],
            )
            for sibling in state.siblings
        ],
        phase=state.phase,
        status=state.status,
    )


def _attempt_from_state(state: AttemptState, attempt_uuid: uuid.UUID) -> RolloutAttemptRecord:
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=state.status,
        # A decoded ``Any`` value shares nested containers with the decoder's
        # input; copy so the ledger never aliases a caller's state dict.
        receipt=None if state.receipt is None else msgspec.to_builtins(state.receipt),
        reward=state.reward,
        mask_sample=state.mask_sample,
        reward_checks=state.reward_checks,
        reward_log_context=state.reward_log_context,
        staging_keys=list(state.staging_keys),
        failure_reason=state.failure_reason,
        failure_kind=state.failure_kind,
        turn_keys=list(state.turn_keys),
        env_state_revision=state.env_state_revision,
    )


def group_header_to_state(
    record: PromptGroupRecoveryRecord,
    header: type[_Header] = GroupHeaderState,  # type: ignore[assignment]
    prompt_ref: type[PromptRefState] = PromptRefState,
) -> _Header:
    """Every persisted field of ``record`` but its siblings (a ledger segment record's header),
    as ``header`` (a subclass of :class:`GroupHeaderState` with another encoding, such as
    the packed piece's, its prompt ref as ``prompt_ref``)."""
    return header(
        group_id=record.group_id,
        admission_id=record.admission_id,
        prompt_id=record.prompt_id,
        prompt_ref=prompt_ref(
            sample_id=record.prompt_ref.sample_id, task_name=record.prompt_ref.task_name
        ),
        task_source=record.task_source,
        recovery_granularity=record.recovery_granularity,
        expected_generations=record.expected_generations,
        target_step=record.target_step,
        start_weight_version=record.start_weight_version,
        phase=record.phase,
        status=record.status,
    )
