"""In-memory lineage records: prompt groups, their siblings and attempts.

Identifiers are derived, never stored twice (DESIGN.md, vocabulary):

- logical rollout id of sibling ``i``: ``"{group_id}_g{i}"``; it is also the
  canonical data-plane sample id of the finished row;
- gate rollout id of sibling ``i``'s current attempt:
  ``"{group_id}_g{i}_a{attempt_uuid.hex}"``; a retry gets a fresh UUID, so a
  late result from an old attempt can never be taken for the new one.

The records are mutable and owned by :class:`~rollvault.ledger.ledger.RolloutRecoveryLedger`;
only the ledger changes them, through its checked transitions. What the ledger
hands out are copies.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import msgspec

from rollvault.ledger.attempt_ids import mint_attempt_uuids
from rollvault.ledger.datum import DatumSpec
from rollvault.ledger.errors import (
    InvalidLedgerInputError,
    LedgerError,
    PromptPayloadUnboundError,
)
from rollvault.ledger.receipts import copy_receipt
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

_SEALED = RolloutAttemptStatus.SEALED


class PromptRef(msgspec.Struct, frozen=True, kw_only=True):
    """Small durable locator for a prompt owned by the input dataset.

    The persistence layer resolves this reference and validates the dataset
    identity before redispatch. The full :class:`DatumSpec` is runtime-only
    state and is deliberately excluded from the serialized ledger.
    """

    sample_id: str
    """The dataset key: ``str(payload["idx"])``."""
    task_name: str | None = None
    """The payload's ``task_name`` (None when the dataset has no tasks)."""

    def __post_init__(self) -> None:
        if not isinstance(self.sample_id, str) or not self.sample_id:
            raise InvalidLedgerInputError(
                f"PromptRef.sample_id must be a non-empty str, got {self.sample_id!r}"
            )
        if self.task_name is not None and not isinstance(self.task_name, str):
            raise InvalidLedgerInputError(
                f"PromptRef.task_name must be a str or None, got {self.task_name!r}"
            )


class RolloutAttemptRecord(msgspec.Struct, kw_only=True):
    """One physical attempt for a stable logical sibling.

    ``receipt``, ``reward``, ``mask_sample``, ``reward_checks``,
    ``reward_log_context`` and ``staging_keys`` are set exactly when the
    attempt is ``sealed``; ``failure_reason`` and ``failure_kind`` exactly
    when it is ``failed``.
    """

    attempt_uuid: uuid.UUID
    status: RolloutAttemptStatus
    receipt: dict[str, Any] | None = None
    reward: float | None = None
    mask_sample: bool | None = None
    reward_checks: RewardChecks | None = None
    reward_log_context: RewardLogContext | None = None
    staging_keys: list[str] = msgspec.field(default_factory=list)
    failure_reason: str | None = None
    failure_kind: AttemptFailureKind | None = None
    """Whose retry budget the failure spends (rollvault's addition, schema 4)."""
    turn_keys: list[str] = msgspec.field(default_factory=list)
    """Staging keys of the episode's committed turns, in order (schema 5). A turn
    commits while the attempt is ``dispatched`` (``commit_turn``); an attempt
    that continues an interrupted episode starts with its predecessor's keys
    (the committed prefix). A sealed attempt's receipt lists them first."""
    env_state_revision: int = 0
    """How many environment-state revisions the committed turns produced (one per turn)."""

    @property
    def attempt_id(self) -> str:
        """Return the compact external representation of this attempt UUID (32 hex digits)."""
        return self.attempt_uuid.hex


class RolloutSiblingRecord(msgspec.Struct, kw_only=True):
    """One stable GRPO generation slot and its physical attempts, oldest first."""

    generation_index: int
    attempts: list[RolloutAttemptRecord]

    @property
    def current_attempt(self) -> RolloutAttemptRecord:
        """The newest attempt; only it may still change or own staging rows."""
        if not self.attempts:
            raise LedgerError(f"sibling {self.generation_index} has no attempts")
        return self.attempts[-1]


class PromptGroupRecoveryRecord(msgspec.Struct, kw_only=True):
    """Lineage and ownership for one logical prompt group."""

    group_id: str
    admission_id: str
    prompt_id: str
    prompt_ref: PromptRef
    task_source: str | None
    recovery_granularity: RecoveryGranularity
    runtime_prompt_payload: DatumSpec | None = None
    """Runtime only: never persisted; a restore rebinds it with ``bind_runtime_prompt``."""
    expected_generations: int
    target_step: int | None
    start_weight_version: int
    siblings: list[RolloutSiblingRecord]
    phase: PromptGroupPhase
    status: PromptGroupStatus

    @property
    def prompt_payload(self) -> DatumSpec:
        """Return the runtime prompt required to redispatch unfinished work."""
        if self.runtime_prompt_payload is None:
            raise PromptPayloadUnboundError(
                f"group {self.group_id!r} (prompt {self.prompt_id!r}) has no runtime prompt "
                "payload bound; after a restore, call bind_runtime_prompt() with the prompt "
                "reconstructed from the dataset before redispatching it"
            )
        return self.runtime_prompt_payload

    @property
    def logical_rollout_ids(self) -> list[str]:
        """Stable sibling ids in generation order."""
        return [f"{self.group_id}_g{index}" for index in range(len(self.siblings))]

    @property
    def gate_rollout_ids(self) -> list[str]:
        """Gate ids of every sibling's current attempt, in generation order."""
        return [
            f"{self.group_id}_g{index}_a{sibling.attempts[-1].attempt_uuid.hex}"
            for index, sibling in enumerate(self.siblings)
        ]

    def logical_rollout_id(self, generation_index: int) -> str:
        """Derive the stable sibling ID instead of storing another UUID string."""
        self._check_index(generation_index)
        return f"{self.group_id}_g{generation_index}"

    def gate_rollout_id(self, generation_index: int) -> str:
        """Derive the physical Gate ID from group, sibling, and attempt UUID."""
        self._check_index(generation_index)
        attempt = self.siblings[generation_index].current_attempt
        return f"{self.group_id}_g{generation_index}_a{attempt.attempt_uuid.hex}"

    @property
    def sealed_generation_indices(self) -> list[int]:
        """Indices of the siblings whose current attempt is sealed."""
        return [
            index
            for index, sibling in enumerate(self.siblings)
            if sibling.attempts[-1].status is _SEALED
        ]

    def _check_index(self, generation_index: int) -> None:
        if (
            isinstance(generation_index, bool)
            or not isinstance(generation_index, int)
            or not 0 <= generation_index < len(self.siblings)
        ):
            raise InvalidLedgerInputError(
                f"group {self.group_id!r}: generation_index {generation_index!r} is not a "
                f"sibling index (the group has {len(self.siblings)} siblings, 0..{len(self.siblings) - 1})"
            )


class SiblingSealResult(msgspec.Struct, frozen=True, kw_only=True):
    """One terminal sibling result waiting for an atomic prompt-group seal."""

    gate_rollout_id: str
    receipt: dict[str, Any] | None
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None = None
    reward_log_context: RewardLogContext | None = None


class InterruptedAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """An attempt that was in flight when the controller process died.

    A restore records it as ``failed`` with kind ``interrupted``
    (``mark_attempt_interrupted``, ``carry_interrupted_attempts``).
    """

    generation_index: int
    attempt_uuid: uuid.UUID
    reason: str

    def failed_record(self) -> RolloutAttemptRecord:
        """The terminal record of this attempt."""
        return RolloutAttemptRecord(
            attempt_uuid=self.attempt_uuid,
            status=RolloutAttemptStatus.FAILED,
            failure_reason=self.reason,
            failure_kind=AttemptFailureKind.INTERRUPTED,
        )


def _new_attempt() -> RolloutAttemptRecord:
    """Mint a fresh ``reserved`` attempt with a random (version 4) UUID."""
    return RolloutAttemptRecord(attempt_uuid=uuid.uuid4(), status=RolloutAttemptStatus.RESERVED)


def new_attempts(count: int) -> list[RolloutAttemptRecord]:
    """Mint ``count`` fresh ``reserved`` attempts (one batch of random UUIDs)."""
    reserved = RolloutAttemptStatus.RESERVED
    return [
        RolloutAttemptRecord(attempt_uuid=attempt_uuid, status=reserved)
        for attempt_uuid in mint_attempt_uuids(count)
    ]


def copy_group_record(record: PromptGroupRecoveryRecord) -> PromptGroupRecoveryRecord:
    """Copy mutable lineage metadata without duplicating the prompt payload.

    C-level ``replace`` calls in plain loops, with no helper call per attempt
    and no comprehension per sibling (each is a function call on CPython
    3.11; the loops measured ~20% faster): the ledger copies whole groups on
    every hand-out, so this is a hot path.
    """
    replace = msgspec.structs.replace
    siblings = []
    for sibling in record.siblings:
        attempts = []
        for attempt in sibling.attempts:
            if attempt.receipt is None:
                attempts.append(
                    replace(
                        attempt,
                        staging_keys=attempt.staging_keys[:],
                        turn_keys=attempt.turn_keys[:],
                    )
                )
            else:
                attempts.append(
                    replace(
                        attempt,
                        staging_keys=attempt.staging_keys[:],
                        turn_keys=attempt.turn_keys[:],
                        receipt=copy_receipt(attempt.receipt),
                    )
                )
        siblings.append(replace(sibling, attempts=attempts))
    return replace(record, siblings=siblings)


def copy_sibling_path(
    record: PromptGroupRecoveryRecord, indexes: Iterable[int]
) -> PromptGroupRecoveryRecord:
    """A new shell of a shared ``record`` in which only the siblings at ``indexes`` are new.

    Each of them is a copy with its own attempts list and its own (shallow)
    copy of its current attempt (:func:`copy_siblings_into`); everything else
    (the other siblings, the older attempts, receipts and key lists) is still
    the shared record's. For a change that only assigns fields of those
    siblings' current attempts and appends to their attempt lists (a
    restore's interrupted attempts and their fresh replacements): the result
    still shares parts with the capture, so the ledger keeps it captured, and
    any later change copies it whole first (:func:`unshare_group_record`). A
    restore changes ~11 of 16 siblings of ~770 groups at 1,024 x 16 this way.
    """
    siblings = record.siblings[:]
    copy_siblings_into(siblings, indexes)
    return msgspec.structs.replace(record, siblings=siblings)


def copy_siblings_into(siblings: list[RolloutSiblingRecord], indexes: Iterable[int]) -> None:
    """Replace the siblings at ``indexes`` of ``siblings`` (a list of a shell the caller made,
    :func:`copy_sibling_path`) by copies, each with its own attempts list and current attempt."""
    replace = msgspec.structs.replace
    for index in indexes:
        sibling = siblings[index]
        attempts = sibling.attempts[:]
        attempts[-1] = replace(attempts[-1])
        siblings[index] = replace(sibling, attempts=attempts)


def unshare_group_record(record: PromptGroupRecoveryRecord) -> PromptGroupRecoveryRecord:
    """A copy of a record shared with a capture, for the ledger to change instead of it.

    As :func:`copy_group_record`, but the receipts are the shared record's:
    nothing changes a stored receipt in place (a seal stores a new one, a
    discard drops it), so the capture's stays as it was, and a restore
    unshares ~770 groups of 1,024 x 16 this way (a receipt's copy is most of
    a group's). What the ledger hands out is still a :func:`copy_group_record`,
    receipts copied too: a caller may change its copy at will.
    """
    replace = msgspec.structs.replace
    siblings = []
    for sibling in record.siblings:
        attempts = []
        for attempt in sibling.attempts:
            attempts.append(
                replace(
                    attempt, staging_keys=attempt.staging_keys[:], turn_keys=attempt.turn_keys[:]
                )
            )
        siblings.append(replace(sibling, attempts=attempts))
    return replace(record, siblings=siblings)
