"""The recovery ledger: the controller's source of truth for rollout ownership."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Self

import msgspec

from rollvault.cut import DataPlaneMutationCut
from rollvault.ledger.arguments import (
    require_bool,
    require_int,
    require_optional_int,
    require_optional_str,
    require_str,
)
from rollvault.ledger.attempt_ids import mint_hex_id_pair
from rollvault.ledger.call_checks import (
    check_complete_cohort,
    distinct_indices,
    group_id_collection,
    require_granularity,
    require_sibling,
)
from rollvault.ledger.datum import DatumSpec, datum_task_name
from rollvault.ledger.errors import (
    CheckpointUnsafeError,
    DuplicateGroupError,
    ForeignCutError,
    InvalidLedgerInputError,
    LedgerError,
    LedgerTransitionError,
    UnknownGroupError,
)
from rollvault.ledger.prompt_identity import _validate_prompt_identity
from rollvault.ledger.receipts import copy_receipt
from rollvault.ledger.records import (
    InterruptedAttempt,
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    SiblingSealResult,
    copy_group_record,
    copy_sibling_path,
    copy_siblings_into,
    new_attempts,
    unshare_group_record,
)
from rollvault.ledger.recovery import (
    abandon_entire_group,
    abandon_unsealed_work,
    carry_interruptions,
    record_interruption,
    record_interruptions,
    redo_interrupted,
    retry_incomplete,
    retryable_siblings,
    siblings_to_redo,
)
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.sealing import (
    SealValues,
    apply_seal,
    check_same_seal,
    fenced_attempt,
    seal_values,
)
from rollvault.ledger.state_convert import ledger_to_state
from rollvault.ledger.state_load import (
    group_record_from_state,
    records_from_state,
)
from rollvault.ledger.state_schema import (
    _LEDGER_STATE_FIELDS,
    LedgerState,
    RolloutRecoveryState,
    read_versioned,
)
from rollvault.ledger.state_upgrade import upgrade_ledger_state
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from rollvault.ledger.transitions import (
    ALL_SEALED_STATUSES,
    ATTEMPT_TRANSITIONS,
    DISCARDABLE_STATUSES,
    GENERATING_ONLY,
    LIVE_ATTEMPT_STATUSES,
    AttemptEvent,
    GroupEvent,
    PhaseEvent,
    check_attempt_transition,
    check_group_transition,
    check_phase_transition,
    require_group_status,
    require_phase,
)
from rollvault.ledger.turns import (
    check_receipt_prefix,
    commit_turn,
    drop_turn_prefix,
)

if TYPE_CHECKING:  # the sidecar module builds on this one
    from rollvault.ledger.sidecar import ParsedRolloutRecoveryState

_SEALED = RolloutAttemptStatus.SEALED
_RESERVED = RolloutAttemptStatus.RESERVED
# The dispatch's, seal's and failure's edges, read once from the transition table for
# the hot paths (a status outside the sources takes the checked, raising path).
_SEAL_SOURCES = ATTEMPT_TRANSITIONS[AttemptEvent.SEAL].sources
_FAIL_SOURCES, _FAILED_TARGET = ATTEMPT_TRANSITIONS[AttemptEvent.FAIL]
_DISPATCH_SOURCES, _DISPATCHED_TARGET = ATTEMPT_TRANSITIONS[AttemptEvent.DISPATCH]
_ADMITTED_ONLY = frozenset({PromptGroupPhase.ADMITTED})
_DROPPABLE = frozenset(
    {
        PromptGroupStatus.GENERATING,
        PromptGroupStatus.READY_TO_FINALIZE,
        PromptGroupStatus.FINALIZATION_UNKNOWN,
    }
)

FinalizationInputs = tuple[
    list[str],
    list[str],
    list[dict[str, Any] | None],
    list[float],
    list[bool],
    list[RewardChecks | None],
    list[RewardLogContext | None],
]
"""Logical ids, gate ids, receipts, rewards, mask flags, checks, log contexts."""


class RolloutRecoveryLedger:
    """In-memory source of truth for token-capture rollout ownership.

    Controller-owned mutations require a live data-plane cut so lineage cannot
    change outside the checkpoint barrier's consistent snapshot boundary:
    every mutator takes the :class:`~rollvault.cut.DataPlaneMutationCut` as
    its first argument and raises unless the calling task holds a mutation
    section (or the exclusive checkpoint section) of it. The ledger binds to
    the first cut it is given and refuses any other.

    A failed call changes nothing. Records handed out (``get_group``,
    ``groups``, ``reserve_group``, ...) are copies; the runtime prompt payload
    in them is shared, not copied.
    """

    def __init__(self) -> None:
        self._groups: dict[str, PromptGroupRecoveryRecord] = {}
        self._cut: DataPlaneMutationCut | None = None
        self._captured: set[str] = set()
        """Groups whose records a :meth:`capture` shares; copied before they change."""
        self._read_only = False

    # -- reading -------------------------------------------------------------------------

    def groups(self) -> list[PromptGroupRecoveryRecord]:
        """Copies of every group, in reservation order."""
        return [self._copy_group(record) for record in self._groups.values()]

    def get_group(self, group_id: str) -> PromptGroupRecoveryRecord:
        """A copy of one group; raises :class:`UnknownGroupError` if absent."""
        return self._copy_group(self._require_group(group_id))

    def __len__(self) -> int:
        return len(self._groups)

    def group_ids(self) -> list[str]:
        """Every group's id, in reservation order (no copies of the records)."""
        return list(self._groups)

    def capture(self, group_ids: Collection[str] | None = None) -> RolloutRecoveryLedger:
        """A read-only ledger holding this ledger's state now, in O(groups) time.

        For the checkpointer, inside the exclusive cut: the records are not
        copied but shared, and this ledger copies a shared record before its
        next change (copy-on-write), so the capture never changes and the
        sidecar can be built from it after the cut is released.
        ``group_ids`` (not in the reference API) captures only those groups,
        so that only they are copied when they change; an unknown one raises
        :class:`UnknownGroupError`.
        """
        view = type(self)()
        view._read_only = True
        if group_ids is None:
            view._groups = dict(self._groups)
            self._captured = set(self._groups)
            return view
        view._groups = {group_id: self._require_group(group_id) for group_id in group_ids}
        self._captured.update(view._groups)
        return view

    def shared_groups(self) -> list[PromptGroupRecoveryRecord]:
        """Every group's record itself, in reservation order, frozen from now on; O(groups).

        Not in the reference API. Shared copy-on-write as :meth:`capture`
        shares them: the ledger copies a shared record before its next change,
        so these never change. Read-only: changing one would change the
        ledger. For a reader of every group that copies would slow down (a
        restore reads all of them several times); :meth:`groups` hands out
        copies to change at will.
        """
        self._captured = set(self._groups)
        return list(self._groups.values())

    def borrowed_groups(self) -> list[PromptGroupRecoveryRecord]:
        """Every group's record itself, in reservation order, valid until the next change.

        Not in the reference API. Nothing is copied and nothing is frozen, so
        the records change with the ledger: for a reader that is done with
        them before its next mutation (a restore's crash evidence reads every
        group once, then changes a few hundred; :meth:`shared_groups` would
        make each of those a copy). Read-only: changing one would change the
        ledger.
        """
        return list(self._groups.values())

    def borrowed_group(self, group_id: str) -> PromptGroupRecoveryRecord:
        """One group's record itself, valid until the ledger's next change; O(1).

        Not in the reference API. :meth:`borrowed_groups` for one group: for a
        reader of a field or one sibling (the target step, a current attempt's
        id) that :meth:`get_group`'s deep copy of every sibling would slow
        down. Nothing is copied or frozen. Read-only: changing it would change
        the ledger. Raises :class:`UnknownGroupError` if absent.
        """
        return self._require_group(group_id)

    def __contains__(self, group_id: object) -> bool:
        return isinstance(group_id, str) and group_id in self._groups

    def expected_staging_keys(self) -> set[str]:
        """Return staged token rows still owned by sealed or live sibling attempts.

        A live (reserved or dispatched) attempt owns its committed turns' rows.

        Only current attempts of groups still in the ledger count: a discarded
        group's rows were cleaned, and a cohort discarded under ``prompt_group``
        granularity no longer owns its rows.
        """
        keys: set[str] = set()
        for record in self._groups.values():
            for sibling in record.siblings:
                attempt = sibling.attempts[-1]
                if attempt.status is _SEALED:
                    keys.update(attempt.staging_keys)
                elif attempt.turn_keys and attempt.status in LIVE_ATTEMPT_STATUSES:
                    # Committed turns of a live attempt, in the same pass (a restore
                    # asks this of ~16k siblings): the prefix a restore continues from.
                    keys.update(attempt.turn_keys)
        return keys

    def finalization_inputs(self, group_id: str) -> FinalizationInputs:
        """Return sealed finalization inputs in stable sibling order.

        The tuple is (logical rollout ids, gate rollout ids, receipts (copies),
        rewards, mask flags, reward checks, reward log contexts). Requires a
        group whose every current attempt is sealed.
        """
        record = self._require_group(group_id)
        require_group_status(
            record, allowed=ALL_SEALED_STATUSES, transition="read finalization inputs"
        )
        receipts: list[dict[str, Any] | None] = []
        rewards: list[float] = []
        masks: list[bool] = []
        checks: list[RewardChecks | None] = []
        contexts: list[RewardLogContext | None] = []
        for sibling in record.siblings:
            attempt = sibling.attempts[-1]
            if attempt.reward is None or attempt.mask_sample is None:
                raise LedgerError(
                    f"group {group_id!r} sibling {sibling.generation_index}: sealed attempt "
                    f"{attempt.attempt_uuid.hex} has no reward or mask flag"
                )
            receipts.append(copy_receipt(attempt.receipt))
            rewards.append(attempt.reward)
            masks.append(attempt.mask_sample)
            checks.append(attempt.reward_checks)
            contexts.append(attempt.reward_log_context)
        return (
            record.logical_rollout_ids,
            record.gate_rollout_ids,
            receipts,
            rewards,
            masks,
            checks,
            contexts,
        )

    def assert_checkpoint_safe(self) -> None:
        """Reject states whose canonical publication outcome is ambiguous.

        A ``finalizing`` group may or may not have published its canonical rows;
        a checkpoint taken now could not tell. The controller finishes the
        publication (and discards the group) or marks it
        ``finalization_unknown`` first.
        """
        finalizing = [
            group_id
            for group_id, record in self._groups.items()
            if record.status is PromptGroupStatus.FINALIZING
        ]
        if finalizing:
            shown = ", ".join(repr(group_id) for group_id in finalizing[:8])
            more = f" and {len(finalizing) - 8} more" if len(finalizing) > 8 else ""
            raise CheckpointUnsafeError(
                f"{len(finalizing)} group(s) are 'finalizing', whose canonical publication "
                f"outcome is ambiguous: {shown}{more}; finish publishing and discard them, or "
                "mark_finalization_unknown(), before checkpointing"
            )

    # -- reservation and admission -------------------------------------------------------

    def reserve_group(
        self,
        cut: DataPlaneMutationCut,
        *,
        prompt_id: str,
        prompt_payload: DatumSpec,
        expected_generations: int,
        target_step: int | None,
        start_weight_version: int,
        task_source: str | None = None,
        recovery_granularity: RecoveryGranularity = RecoveryGranularity.SIBLING,
        admitted: bool = True,
        group_id: str | None = None,
        admission_id: str | None = None,
        prompt_ref: PromptRef | None = None,
    ) -> PromptGroupRecoveryRecord:
        """Create one logical group and its first physical sibling attempts.

        Each of the ``expected_generations`` siblings gets one ``reserved``
        attempt; the group is ``generating``, in phase ``admitted`` (or
        ``reserved`` when ``admitted`` is False). ``group_id`` and
        ``admission_id`` default to fresh UUID hex strings; ``prompt_ref`` to
        ``PromptRef(sample_id=prompt_id, task_name=payload.get("task_name"))``.
        The payload must resolve to the ref (``_validate_prompt_identity``).
        """
        fresh = mint_hex_id_pair() if group_id is None or admission_id is None else ("", "")
        new_id = fresh[0] if group_id is None else group_id
        self._enter(cut, "reserve_group", new_id)
        admission = fresh[1] if admission_id is None else admission_id
        # Exact-type fast path (a reservation is a hot path); any other argument
        # takes the checks in the order of their messages, which raise or accept it.
        if not (
            type(new_id) is str
            and new_id
            and new_id not in self._groups
            and type(prompt_id) is str
            and prompt_id
            and type(expected_generations) is int
            and expected_generations >= 1
            and (target_step is None or (type(target_step) is int and target_step >= 0))
            and type(start_weight_version) is int
            and start_weight_version >= 0
            and (task_source is None or type(task_source) is str)
            and type(admitted) is bool
            and type(recovery_granularity) is RecoveryGranularity
            and type(admission) is str
            and admission
        ):
            self._check_reserve_args(
                new_id,
                prompt_id=prompt_id,
                expected_generations=expected_generations,
                target_step=target_step,
                start_weight_version=start_weight_version,
                task_source=task_source,
                admitted=admitted,
                recovery_granularity=recovery_granularity,
                admission_id=admission,
            )
        granularity = (
            recovery_granularity
            if type(recovery_granularity) is RecoveryGranularity
            else require_granularity(recovery_granularity, where="")
        )
        count = expected_generations
        task_name = datum_task_name(prompt_payload, group_id=new_id)
        if prompt_ref is None:
            ref = PromptRef(sample_id=prompt_id, task_name=task_name)
            # The ref is the payload's own (idx and task name): only idx can differ.
            if str(prompt_payload["idx"]) != prompt_id:
                _validate_prompt_identity(ref, prompt_payload, group_id=new_id)  # raises
        else:
            ref = prompt_ref
            if not isinstance(ref, PromptRef):
                raise InvalidLedgerInputError(
                    f"reserve_group(group {new_id!r}): prompt_ref must be a PromptRef, got "
                    f"{type(ref).__name__}"
                )
            _validate_prompt_identity(ref, prompt_payload, group_id=new_id)
        attempts = new_attempts(count)
        record = PromptGroupRecoveryRecord(
            group_id=new_id,
            admission_id=admission,
            prompt_id=prompt_id,
            prompt_ref=ref,
            task_source=task_source,
            recovery_granularity=granularity,
            runtime_prompt_payload=prompt_payload,
            expected_generations=count,
            target_step=target_step,
            start_weight_version=start_weight_version,
            siblings=[
                RolloutSiblingRecord(generation_index=index, attempts=[attempt])
                for index, attempt in enumerate(attempts)
            ],
            phase=PromptGroupPhase.ADMITTED if admitted else PromptGroupPhase.RESERVED,
            status=PromptGroupStatus.GENERATING,
        )
        self._groups[new_id] = record
        # The caller's copy, built as the record was (fresh attempts hold nothing
        # but their UUID and status): cheaper than copying the record.
        return msgspec.structs.replace(
            record,
            siblings=[
                RolloutSiblingRecord(
                    generation_index=index,
                    attempts=[
                        RolloutAttemptRecord(attempt_uuid=attempt.attempt_uuid, status=_RESERVED)
                    ],
                )
                for index, attempt in enumerate(attempts)
            ],
        )

    def _check_reserve_args(
        self,
        new_id: object,
        *,
        prompt_id: object,
        expected_generations: object,
        target_step: object,
        start_weight_version: object,
        task_source: object,
        admitted: object,
        recovery_granularity: object,
        admission_id: object,
    ) -> None:
        """The checks of :meth:`reserve_group`'s arguments, in the order of their messages."""
        where = f"reserve_group(group {new_id!r})"
        require_str(new_id, name="group_id", where=where)
        if new_id in self._groups:
            raise DuplicateGroupError(f"{where}: the ledger already holds group {new_id!r}")
        require_str(prompt_id, name="prompt_id", where=where)
        require_int(expected_generations, name="expected_generations", where=where, minimum=1)
        require_optional_int(target_step, name="target_step", where=where)
        require_int(start_weight_version, name="start_weight_version", where=where)
        require_optional_str(task_source, name="task_source", where=where)
        require_bool(admitted, name="admitted", where=where)
        require_granularity(recovery_granularity, where=where)
        require_str(admission_id, name="admission_id", where=where)

    def mark_group_admitted(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        *,
        target_step: int | None,
        start_weight_version: int,
    ) -> None:
        """Commit sampler admission without replacing sibling lineage (``reserved -> admitted``)."""
        self._enter(cut, "mark_group_admitted", group_id)
        record = self._mutable_group(group_id)
        where = f"mark_group_admitted(group {group_id!r})"
        require_optional_int(target_step, name="target_step", where=where)
        require_int(start_weight_version, name="start_weight_version", where=where)
        phase = check_phase_transition(record, PhaseEvent.ADMIT)
        record.target_step = target_step
        record.start_weight_version = start_weight_version
        record.phase = phase

    def bind_runtime_prompt(
        self, cut: DataPlaneMutationCut, group_id: str, prompt_payload: DatumSpec
    ) -> None:
        """Attach a dataset-reconstructed prompt after identity validation."""
        self._enter(cut, "bind_runtime_prompt", group_id)
        record = self._require_group(group_id)
        _validate_prompt_identity(record.prompt_ref, prompt_payload, group_id=group_id)
        if group_id in self._captured:
            # The payload is a field of the group itself: a new shell is enough
            # (a restore binds every group). Its siblings stay shared, and the
            # group captured, until they change (_mutable_group copies them).
            self._groups[group_id] = msgspec.structs.replace(
                record, runtime_prompt_payload=prompt_payload
            )
        else:
            record.runtime_prompt_payload = prompt_payload

    # -- generation ------------------------------------------------------------------------

    def mark_group_dispatched(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        *,
        generation_indices: list[int] | None = None,
    ) -> None:
        """Move the selected current sibling attempts to dispatched.

        ``None`` selects every sibling whose current attempt is ``reserved``
        (after a retry, the ones minted for it). The group must be admitted and
        ``generating``; every selected attempt must be ``reserved``.
        """
        record = self._enter_group(cut, "mark_group_dispatched", group_id)
        require_group_status(record, allowed=GENERATING_ONLY, transition="dispatch")
        require_phase(record, allowed=_ADMITTED_ONLY, transition="dispatch")
        if generation_indices is None:
            indices = [
                index
                for index, sibling in enumerate(record.siblings)
                if sibling.attempts[-1].status is _RESERVED
            ]
            if not indices:
                raise LedgerTransitionError(
                    f"group {group_id!r}: cannot dispatch: no sibling has a reserved current "
                    "attempt (retry failed siblings with prepare_incomplete_retry first)",
                    group_id=group_id,
                    transition=AttemptEvent.DISPATCH.value,
                    status=record.status.value,
                )
        else:
            indices = distinct_indices(record, generation_indices)
        attempts = [record.siblings[index].attempts[-1] for index in indices]
        for index, attempt in zip(indices, attempts, strict=True):
            if attempt.status not in _DISPATCH_SOURCES:
                check_attempt_transition(
                    attempt, AttemptEvent.DISPATCH, group_id=group_id, generation_index=index
                )  # raises
        for attempt in attempts:
            attempt.status = _DISPATCHED_TARGET

    def mark_sibling_sealed(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        *,
        generation_index: int,
        gate_rollout_id: str,
        receipt: dict[str, Any] | None,
        reward: float,
        mask_sample: bool,
        reward_checks: RewardChecks | None = None,
        reward_log_context: RewardLogContext | None = None,
    ) -> None:
        """Record one streamed sibling receipt as soon as the row arrives.

        ``gate_rollout_id`` must name the sibling's current attempt (fencing)
        and so must the receipt (see :mod:`rollvault.ledger.receipts` for its
        shape). Sealing the last unsealed sibling makes the group
        ``ready_to_finalize``. Repeating an identical seal is a no-op; a
        different one raises :class:`SealConflictError`.
        """
        record = self._enter_group(cut, "mark_sibling_sealed", group_id)
        siblings = record.siblings
        # Exact-type fast path of require_sibling (this is the hot path).
        if not (type(generation_index) is int and 0 <= generation_index < len(siblings)):
            require_sibling(record, generation_index)
        attempt = siblings[generation_index].attempts[-1]
        # fenced_attempt's check inlined (this is the hot path); it raises with the message.
        if gate_rollout_id != f"{record.group_id}_g{generation_index}_a{attempt.attempt_uuid.hex}":
            fenced_attempt(record, generation_index, gate_rollout_id)
        values = seal_values(
            record,
            generation_index,
            attempt,
            gate_rollout_id=gate_rollout_id,
            receipt=receipt,
            reward=reward,
            mask_sample=mask_sample,
            reward_checks=reward_checks,
            reward_log_context=reward_log_context,
        )
        status = attempt.status
        if status is _SEALED:
            check_same_seal(record, generation_index, attempt, values)
            return
        if status not in _SEAL_SOURCES or record.status is not PromptGroupStatus.GENERATING:
            self._check_sealable(record, generation_index, attempt)  # raises
        if attempt.turn_keys:
            check_receipt_prefix(record, generation_index, attempt, values.staging_keys)
        # apply_seal inlined.
        attempt.receipt = values.receipt
        attempt.staging_keys = values.staging_keys
        attempt.reward = values.reward
        attempt.mask_sample = values.mask_sample
        attempt.reward_checks = values.reward_checks
        attempt.reward_log_context = values.reward_log_context
        attempt.status = _SEALED
        # Last sibling first: seals arrive roughly in generation order, so an
        # unsealed one is usually found at once.
        for sibling in reversed(siblings):
            if sibling.attempts[-1].status is not _SEALED:
                return
        record.status = check_group_transition(record, GroupEvent.ALL_SIBLINGS_SEALED)

    def mark_group_sealed(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        results: dict[int, SiblingSealResult],
    ) -> None:
        """Atomically seal one complete prompt-group-scoped physical cohort.

        ``results`` maps every generation index of the group to its result.
        Everything is checked before anything is applied, so either the whole
        cohort is sealed (and the group becomes ``ready_to_finalize``) or
        nothing changes. Results identical to an existing seal are no-ops.
        """
        self._enter(cut, "mark_group_sealed", group_id)
        record = self._mutable_group(group_id)
        check_complete_cohort(record, results)
        pending: list[tuple[RolloutAttemptRecord, SealValues]] = []
        for index in range(len(record.siblings)):
            result = results[index]
            attempt = fenced_attempt(record, index, result.gate_rollout_id)
            values = seal_values(
                record,
                index,
                attempt,
                gate_rollout_id=result.gate_rollout_id,
                receipt=result.receipt,
                reward=result.reward,
                mask_sample=result.mask_sample,
                reward_checks=result.reward_checks,
                reward_log_context=result.reward_log_context,
            )
            if attempt.status is _SEALED:
                check_same_seal(record, index, attempt, values)
                continue
            self._check_sealable(record, index, attempt)
            pending.append((attempt, values))
        for attempt, values in pending:
            apply_seal(attempt, values)
        if pending:
            self._complete_if_all_sealed(record)

    def mark_sibling_failed(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        *,
        generation_index: int,
        gate_rollout_id: str,
        reason: str,
        failure_kind: AttemptFailureKind = AttemptFailureKind.INFRA,
    ) -> None:
        """Record that the sibling's current (dispatched) attempt failed on the Gate.

        Not in the reference API, which has no explicit failure mutator.
        ``gate_rollout_id`` must name the current attempt (fencing); ``reason``
        and ``failure_kind`` (whose retry budget it spends) are persisted with
        the attempt. The controller then retries the sibling with
        :meth:`prepare_incomplete_retry` or gives the group up.
        """
        record = self._enter_group(cut, "mark_sibling_failed", group_id)
        if not (type(generation_index) is int and 0 <= generation_index < len(record.siblings)):
            require_sibling(record, generation_index)  # raises
        attempt = fenced_attempt(record, generation_index, gate_rollout_id)
        # The checks are ordered as the messages expect; each builds its
        # message (and the location) only when it fails: failing is a hot path.
        if type(reason) is not str or not reason:
            require_str(reason, name="reason", where=self._where(record, generation_index, attempt))
        if record.status is not PromptGroupStatus.GENERATING:
            require_group_status(
                record,
                allowed=GENERATING_ONLY,
                transition=AttemptEvent.FAIL.value,
                generation_index=generation_index,
                attempt=attempt,
            )
        if not isinstance(failure_kind, AttemptFailureKind):
            raise InvalidLedgerInputError(
                f"{self._where(record, generation_index, attempt)}: failure_kind must be an "
                f"AttemptFailureKind, got {failure_kind!r}"
            )
        if attempt.status not in _FAIL_SOURCES:
            check_attempt_transition(
                attempt, AttemptEvent.FAIL, group_id=group_id, generation_index=generation_index
            )  # raises
        attempt.failure_reason = reason
        attempt.failure_kind = failure_kind
        attempt.status = _FAILED_TARGET

    @staticmethod
    def _where(
        record: PromptGroupRecoveryRecord, generation_index: int, attempt: RolloutAttemptRecord
    ) -> str:
        return (
            f"group {record.group_id!r} sibling {generation_index} "
            f"attempt {attempt.attempt_uuid.hex}"
        )

    def commit_turn(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        *,
        generation_index: int,
        gate_rollout_id: str,
        staging_key: str,
        turn_index: int,
    ) -> int:
        """Record one committed turn of the sibling's current, dispatched attempt.

        Not in the reference API. Fenced by ``gate_rollout_id`` like a seal, so
        a superseded attempt can never commit; turns commit in order
        (``turn_index`` is the number already committed, the inherited prefix
        included). The turn's row must already be staged under
        ``staging_key``, in the same mutation section. Returns the attempt's
        new environment-state revision.
        """
        self._enter(cut, "commit_turn", group_id)
        record = self._mutable_group(group_id)
        self._require_sibling(record, generation_index)
        attempt = commit_turn(
            record,
            generation_index,
            gate_rollout_id=gate_rollout_id,
            staging_key=staging_key,
            turn_index=turn_index,
        )
        return attempt.env_state_revision

    def restart_episode(
        self, cut: DataPlaneMutationCut, group_id: str, *, generation_index: int
    ) -> list[str]:
        """Drop the committed prefix of a sibling's reserved attempt; return its staging keys.

        Not in the reference API. For an episode that cannot continue where
        it stopped (``restart_only``, or its environment state is lost): the
        caller clears the returned rows in the same mutation section.
        """
        self._enter(cut, "restart_episode", group_id)
        record = self._mutable_group(group_id)
        self._require_sibling(record, generation_index)
        return drop_turn_prefix(record, generation_index)

    def mark_attempt_interrupted(
        self, cut: DataPlaneMutationCut, group_id: str, interrupted: InterruptedAttempt
    ) -> None:
        """Record, on restore, an attempt that was in flight when the process died.

        Not in the reference API. The attempt becomes ``failed`` with kind
        ``interrupted``, whether the restored snapshot holds it (``reserved``
        or ``dispatched``) or it was minted after the snapshot (then the
        attempt it superseded is abandoned and it is appended). Call before
        :meth:`prepare_for_restart`, which mints its replacement. The group
        must be ``generating``.
        """
        self._enter(cut, "mark_attempt_interrupted", group_id)
        record = self._mutable_group(group_id)
        self._check_interrupted(record, [interrupted], "record an interrupted attempt")
        record_interruption(record, interrupted)

    def mark_attempts_interrupted(
        self, cut: DataPlaneMutationCut, group_id: str, interrupted: list[InterruptedAttempt]
    ) -> None:
        """:meth:`mark_attempt_interrupted` for each of ``interrupted``, in order, at once.

        Not in the reference API. A restore records thousands: one call per
        group checks the cut, the group and its status once. All or nothing:
        when one of them is refused, none is recorded.
        """
        self._record_group_interruptions(cut, group_id, interrupted)

    def _record_group_interruptions(
        self, cut: DataPlaneMutationCut, group_id: str, interrupted: list[InterruptedAttempt]
    ) -> set[int] | None:
        """:meth:`mark_attempts_interrupted`; returns the siblings it copied when the group
        was shared (its new record is this call's own copy at those siblings, else None)."""
        self._enter(cut, "mark_attempts_interrupted", group_id)
        record = self._require_group(group_id)
        self._check_interrupted(record, interrupted, "record an interrupted attempt")
        if group_id not in self._captured:
            record_interruptions(record, interrupted)
            return None
        # Shared with a capture (a restore's ledger seed holds every loaded group):
        # recorded into a copy of only the siblings it touches, installed only when all
        # are recorded, so a refusal needs no undo and leaves the shared record as it
        # was. The copy shares the rest with the capture: it stays captured, so that a
        # later change copies it whole first (see copy_sibling_path).
        touched = {item.generation_index for item in interrupted}
        copy = copy_sibling_path(record, touched)
        record_interruptions(copy, interrupted, undo=False)
        self._groups[group_id] = copy
        return touched

    def carry_interrupted_attempts(
        self,
        cut: DataPlaneMutationCut,
        group_id: str,
        interrupted: list[InterruptedAttempt],
    ) -> None:
        """Give a freshly reserved group the interrupted attempts of its prompt's lost group.

        Not in the reference API. A group reserved after the snapshot that a
        restore used is lost with the process, but its attempts that were in
        flight are not forgotten: when the prompt is reserved again, they go
        into the new group's siblings as ``failed`` (kind ``interrupted``)
        before each sibling's first attempt, which must still be ``reserved``.
        """
        self._enter(cut, "carry_interrupted_attempts", group_id)
        record = self._mutable_group(group_id)
        self._check_interrupted(record, interrupted, "carry interrupted attempts")
        carry_interruptions(record, interrupted)

    @staticmethod
    def _check_interrupted(
        record: PromptGroupRecoveryRecord, interrupted: list[InterruptedAttempt], transition: str
    ) -> None:
        require_group_status(record, allowed=GENERATING_ONLY, transition=transition)
        siblings = len(record.siblings)
        for item in interrupted:
            if (
                type(item) is InterruptedAttempt
                and type(item.generation_index) is int
                and 0 <= item.generation_index < siblings
                and type(item.reason) is str
                and item.reason
            ):
                continue  # what a restore records by the thousand: nothing more to check
            if not isinstance(item, InterruptedAttempt):
                raise InvalidLedgerInputError(
                    f"group {record.group_id!r}: {transition}: expected InterruptedAttempt "
                    f"items, got {type(item).__name__}"
                )
            require_sibling(record, item.generation_index)
            if type(item.reason) is not str or not item.reason:  # a restore records thousands
                require_str(
                    item.reason,
                    name="reason",
                    where=f"group {record.group_id!r} sibling {item.generation_index}",
                )

    # -- failure and recovery ------------------------------------------------------------

    def abandon_unsealed(self, cut: DataPlaneMutationCut, group_id: str) -> None:
        """Abandon failed work at the group's persisted recovery granularity.

        ``sibling``: every reserved or dispatched current attempt is abandoned;
        sealed siblings are kept. ``prompt_group``: every sibling is abandoned,
        sealed ones included (``_abandon_entire_group``). No replacement is
        minted; :meth:`prepare_incomplete_retry` does that.
        """
        self._enter(cut, "abandon_unsealed", group_id)
        record = self._mutable_group(group_id)
        require_group_status(record, allowed=GENERATING_ONLY, transition="abandon unsealed work")
        abandon_unsealed_work(record)

    def prepare_incomplete_retry(
        self, cut: DataPlaneMutationCut, group_id: str
    ) -> PromptGroupRecoveryRecord:
        """Mint fresh physical attempts according to the persisted granularity.

        ``sibling``: a fresh ``reserved`` attempt for every sibling whose
        current attempt is failed or abandoned. ``prompt_group``: every sibling
        is abandoned (sealed ones included) and gets a fresh attempt. At least
        one sibling must be failed or abandoned. Returns a copy of the group.
        """
        record = self._enter_group(cut, "prepare_incomplete_retry", group_id)
        require_group_status(record, allowed=GENERATING_ONLY, transition="retry")
        retryable = retryable_siblings(record)
        if not retryable:
            raise LedgerTransitionError(
                f"group {group_id!r}: cannot retry: no sibling's current attempt is failed or "
                f"abandoned (current attempts: "
                f"{[sibling.attempts[-1].status.value for sibling in record.siblings]})",
                group_id=group_id,
                transition="retry",
                status=record.status.value,
            )
        retry_incomplete(record, retryable)
        return self._copy_group(record)

    def prepare_for_restart(self, cut: DataPlaneMutationCut) -> None:
        """Apply each group's persisted restore policy to interrupted attempts.

        Run once on a restored ledger, before the pumps start. For a
        ``generating`` group, the reserved or dispatched current attempts are
        abandoned and replaced by fresh reserved ones (``sibling``), or the
        whole cohort is (``prompt_group``), so the group can be redispatched.
        A ``finalizing`` group becomes ``finalization_unknown``: whether its
        canonical rows were published is resolved by looking for them.
        """
        self._enter(cut, "prepare_for_restart")
        self._restart(cut, {})

    def restart_interrupted(
        self, cut: DataPlaneMutationCut, interrupted: Mapping[str, list[InterruptedAttempt]]
    ) -> None:
        """:meth:`mark_attempts_interrupted` of each group of ``interrupted``, then
        :meth:`prepare_for_restart`, in one pass.

        Not in the reference API. ``interrupted``: per group, the attempts a
        restore's crash evidence found in flight, each group's checked and
        recorded exactly as :meth:`mark_attempts_interrupted` does, all of
        them before any replacement; a refusal leaves the groups recorded
        before it. A group shared with a capture (a restore's ledger seed
        shares every loaded group) is copied once for both changes, and only
        at the siblings they touch (``copy_sibling_path``), where the two
        calls copied it whole.
        """
        self._enter(cut, "restart_interrupted")
        self._restart(cut, interrupted)

    def _restart(
        self, cut: DataPlaneMutationCut, interrupted: Mapping[str, list[InterruptedAttempt]]
    ) -> None:
        """:meth:`restart_interrupted`, the cut checked by the caller."""
        # Groups copied here at their siblings' path (copy_sibling_path): the siblings
        # each copy owns already, for the replacements to copy only the others.
        owned = {
            group_id: touched
            for group_id, items in interrupted.items()
            if (touched := self._record_group_interruptions(cut, group_id, items)) is not None
        }
        redone: list[tuple[str, list[int]]] = []
        fresh_count = 0
        for group_id, shared in list(self._groups.items()):
            # Only a group that changes is unshared from a capture (a restore
            # holds one): copying every group would double the restore's work.
            if shared.status is PromptGroupStatus.FINALIZING:
                record = self._mutable_group(group_id)
                record.status = check_group_transition(record, GroupEvent.FINALIZATION_UNKNOWN)
            elif shared.status is PromptGroupStatus.GENERATING:
                # Found on the shared record, applied by index to the unshared one.
                redo = siblings_to_redo(shared)
                if redo:
                    redone.append((group_id, redo))
                    if shared.recovery_granularity is not RecoveryGranularity.PROMPT_GROUP:
                        fresh_count += len(redo)
        # The sibling groups' fresh attempts minted at once: one random read and one
        # C conversion instead of one per group (~770 per restore at 1,024 x 16).
        fresh = iter(new_attempts(fresh_count))
        for group_id, redo in redone:
            record = self._restart_copy(group_id, redo, owned.get(group_id))
            redo_interrupted(record, redo, fresh)

    def _restart_copy(
        self, group_id: str, redo: list[int], owned: set[int] | None
    ) -> PromptGroupRecoveryRecord:
        """The record ``redo_interrupted`` changes at ``redo``, a ``generating`` group's.

        A shared ``sibling`` group (a restore's, frozen for its ledger seed) gets a
        copy of only the siblings redone (their current attempt is abandoned or
        failed, and a fresh one appended) and stays captured; when ``owned`` (the
        siblings :meth:`restart_interrupted` copied recording its interruptions), its
        record is that copy, which gets the others. A ``prompt_group`` group changes
        every sibling and is copied whole.
        """
        record = self._groups[group_id]
        if group_id not in self._captured or (
            record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
        ):
            return self._mutable_group(group_id)
        if owned is None:
            record = copy_sibling_path(record, redo)
            self._groups[group_id] = record
        else:
            copy_siblings_into(record.siblings, [index for index in redo if index not in owned])
        return record

    @staticmethod
    def _abandon_entire_group(record: PromptGroupRecoveryRecord) -> None:
        """Discard every current sibling when an incomplete group is atomic.

        Sealed staging rows become unreferenced here. The controller's restore
        inventory pass removes those rows from TQ before redispatch.
        """
        abandon_entire_group(record)

    # -- finalization ----------------------------------------------------------------------

    def mark_finalization_started(self, cut: DataPlaneMutationCut, group_id: str) -> None:
        """``ready_to_finalize`` or ``finalization_unknown`` -> ``finalizing``."""
        self._enter(cut, "mark_finalization_started", group_id)
        record = self._mutable_group(group_id)
        record.status = check_group_transition(record, GroupEvent.START_FINALIZATION)

    def mark_finalization_unknown(self, cut: DataPlaneMutationCut, group_id: str) -> None:
        """``finalizing`` -> ``finalization_unknown`` (publication outcome not known)."""
        self._enter(cut, "mark_finalization_unknown", group_id)
        record = self._mutable_group(group_id)
        record.status = check_group_transition(record, GroupEvent.FINALIZATION_UNKNOWN)

    def discard_group(self, cut: DataPlaneMutationCut, group_id: str) -> None:
        """Drop a group only after its external TQ/Gate ownership is cleaned.

        Allowed from ``finalizing`` or ``finalization_unknown``: the controller
        published (or found) the canonical rows and cleared the staging rows.
        """
        self._enter(cut, "discard_group", group_id)
        record = self._require_group(group_id)
        require_group_status(record, allowed=DISCARDABLE_STATUSES, transition="discard")
        self._forget(group_id)

    def drop_group(self, cut: DataPlaneMutationCut, group_id: str) -> None:
        """Give a group up for good, with whatever work it holds.

        Not in the reference API, which has no way to lose a prompt. Used when
        a group's retry budget is spent, and by the ``trainer_checkpoint``
        restore baseline, which regenerates everything. Allowed while the
        group is ``generating`` with no attempt in flight (every current
        attempt sealed, failed or abandoned), ``ready_to_finalize`` or
        ``finalization_unknown``; never while ``finalizing``, whose canonical
        rows may be half published. The controller clears the group's rows and
        records the loss or the replacement in the same mutation.
        """
        self._enter(cut, "drop_group", group_id)
        record = self._require_group(group_id)
        require_group_status(record, allowed=_DROPPABLE, transition="drop")
        in_flight = [
            sibling.generation_index
            for sibling in record.siblings
            if sibling.attempts[-1].status
            in (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
        ]
        if in_flight:
            raise LedgerTransitionError(
                f"group {group_id!r}: cannot drop: siblings {in_flight} still have a reserved "
                "or dispatched attempt; abandon them first (abandon_unsealed)",
                group_id=group_id,
                transition="drop",
                status=record.status.value,
            )
        self._forget(group_id)

    def discard_canonical_groups(self, cut: DataPlaneMutationCut, group_ids: set[str]) -> int:
        """Prefer canonical TQ ownership over a stale unfinished sidecar row.

        Drops every listed group the ledger holds, whatever its status (its
        canonical rows exist, so the ledger row is stale). Returns how many
        were dropped; ids the ledger does not hold are ignored.
        """
        self._enter(cut, "discard_canonical_groups")
        ids = group_id_collection(group_ids, where="discard_canonical_groups")
        dropped = 0
        for group_id in ids:
            if group_id in self._groups:
                self._forget(group_id)
                dropped += 1
        return dropped

    # -- persistence -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the versioned metadata persisted in ``rollout_recovery.json``.

        JSON-safe builtins (attempt UUIDs as 32 hex digits), sharing nothing
        with the ledger. The runtime prompt payload is never included.
        """
        state: dict[str, Any] = msgspec.to_builtins(self._ledger_state())
        return state

    def _ledger_state(self, exclude: Collection[str] = ()) -> LedgerState:
        return ledger_to_state(self._groups.values(), exclude=exclude)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Self:
        """Restore and validate a ledger metadata envelope.

        Rejects, naming the JSON path and group/sibling/attempt: a missing,
        unknown or mistyped field; an unsupported schema version; duplicate
        group ids or attempt UUIDs; non-contiguous generation indices; results
        on attempts that are not sealed; a status that contradicts the siblings.
        Restored groups have no runtime prompt payload (``bind_runtime_prompt``).
        A state of an older supported version is upgraded first.
        """
        typed = read_versioned(
            upgrade_ledger_state(state),
            LedgerState,
            expected=_LEDGER_STATE_FIELDS,
            what="rollout recovery ledger state",
        )
        ledger = cls()
        ledger._groups = records_from_state(typed)
        return ledger

    def load_state_dict(self, cut: DataPlaneMutationCut, state: RolloutRecoveryState) -> None:
        """Replace this empty ledger from a validated checkpoint envelope."""
        self._enter(cut, "load_state_dict")
        if self._groups:
            raise LedgerError(
                f"load_state_dict needs an empty ledger; this one holds {len(self._groups)} "
                "group(s)"
            )
        self._groups = type(self).from_state_dict(state)._groups
        self._captured = set()

    def load_parsed_state(
        self, cut: DataPlaneMutationCut, parsed: ParsedRolloutRecoveryState
    ) -> None:
        """Replace this empty ledger from a parsed sidecar (``decode_rollout_recovery_state``).

        Not in the reference API. The same result as ``load_state_dict(cut,
        parsed.ledger_state)``, without checking again what parsing checked:
        the records are the checked ones of a ledger read from segments
        (``parsed.checked_groups``, handed over without a copy the first
        time) or built from the typed state that parsing accepted
        (``parsed.checked_ledger``), which must not have been changed since;
        the builtins ``parsed.ledger_state`` are never built. A ledger state
        made by hand is loaded by ``load_state_dict``.
        """
        self._enter(cut, "load_parsed_state")
        if self._groups:
            raise LedgerError(
                f"load_parsed_state needs an empty ledger; this one holds {len(self._groups)} "
                "group(s)"
            )
        self._groups = parsed.take_records()
        self._captured = set()

    @classmethod
    def _group_from_state(
        cls,
        raw_group: Any,
        *,
        seen_attempt_uuids: set[uuid.UUID],
        where: str = "$.groups[?]",
    ) -> PromptGroupRecoveryRecord:
        """Check one persisted group (a ``GroupState`` or its builtins) and build its record.

        Adds the group's attempt UUIDs to ``seen_attempt_uuids`` and raises if
        one was already there (attempt UUIDs are unique across the ledger).
        """
        return group_record_from_state(
            raw_group, seen_attempt_uuids=seen_attempt_uuids, where=where
        )

    # -- internals -------------------------------------------------------------------------

    def _enter(
        self, cut: DataPlaneMutationCut, operation: str, group_id: str | None = None
    ) -> None:
        """Require the caller to hold ``cut`` and ``cut`` to be this ledger's cut."""
        bound = self._cut
        if cut is bound and cut.holds_mutation():
            return  # the hot path: no message to format
        call = f"RolloutRecoveryLedger.{operation}" + (
            "()" if group_id is None else f"(group {group_id!r})"
        )
        if self._read_only:
            raise LedgerError(f"{call}: this ledger is a read-only capture")
        cut.require_mutation(call)
        if bound is None:
            self._cut = cut
        elif cut is not bound:
            raise ForeignCutError(
                f"{call}: given a different "
                "DataPlaneMutationCut than the one this ledger is bound to; a snapshot taken "
                "under the bound cut would not see this mutation"
            )

    def _forget(self, group_id: str) -> None:
        del self._groups[group_id]
        self._captured.discard(group_id)

    def _enter_group(
        self, cut: DataPlaneMutationCut, operation: str, group_id: str
    ) -> PromptGroupRecoveryRecord:
        """:meth:`_enter`, then :meth:`_mutable_group`, in one call (the hot mutators)."""
        if not (cut is self._cut and cut.holds_mutation()):
            self._enter(cut, operation, group_id)  # raises, or binds the first cut
        record = self._groups.get(group_id) if isinstance(group_id, str) else None
        if record is None:
            raise UnknownGroupError(f"the ledger holds no group {group_id!r}")
        if group_id in self._captured:
            record = unshare_group_record(record)
            self._groups[group_id] = record
            self._captured.discard(group_id)
        return record

    def _mutable_group(self, group_id: str) -> PromptGroupRecoveryRecord:
        """The live record of a group about to change, unshared from any capture first."""
        # _require_group inlined: every mutation of a group starts here.
        record = self._groups.get(group_id) if isinstance(group_id, str) else None
        if record is None:
            raise UnknownGroupError(f"the ledger holds no group {group_id!r}")
        if group_id in self._captured:
            record = unshare_group_record(record)
            self._groups[group_id] = record
            self._captured.discard(group_id)
        return record

    def _require_group(self, group_id: str) -> PromptGroupRecoveryRecord:
        record = self._groups.get(group_id) if isinstance(group_id, str) else None
        if record is None:
            raise UnknownGroupError(f"the ledger holds no group {group_id!r}")
        return record

    @staticmethod
    def _copy_group(record: PromptGroupRecoveryRecord) -> PromptGroupRecoveryRecord:
        """Copy mutable lineage metadata without duplicating the prompt payload."""
        return copy_group_record(record)

    @staticmethod
    def _require_sibling(
        record: PromptGroupRecoveryRecord, generation_index: int
    ) -> RolloutSiblingRecord:
        return require_sibling(record, generation_index)

    @staticmethod
    def _require_group_status(
        record: PromptGroupRecoveryRecord,
        *,
        allowed: set[PromptGroupStatus],
        transition: str,
    ) -> None:
        require_group_status(record, allowed=allowed, transition=transition)

    @staticmethod
    def _check_sealable(
        record: PromptGroupRecoveryRecord, generation_index: int, attempt: RolloutAttemptRecord
    ) -> None:
        require_group_status(
            record,
            allowed=GENERATING_ONLY,
            transition=AttemptEvent.SEAL.value,
            generation_index=generation_index,
            attempt=attempt,
        )
        check_attempt_transition(
            attempt, AttemptEvent.SEAL, group_id=record.group_id, generation_index=generation_index
        )

    @staticmethod
    def _complete_if_all_sealed(record: PromptGroupRecoveryRecord) -> None:
        for sibling in record.siblings:
            if sibling.attempts[-1].status is not _SEALED:
                return
        record.status = check_group_transition(record, GroupEvent.ALL_SIBLINGS_SEALED)
