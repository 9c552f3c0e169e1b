"""The rollout pump: prompts -> ledger -> gate -> sealed groups -> finalizer.

Each admitted prompt group owns a *slot*: one in-flight permit (released when
the group is finalized or given up) and one replay-capacity permit (released
by the train pump when the group is trained, or here when the group is lost
without replacement). A slot runs its group's attempts on the gate, retries
failures within budget, and either finalizes the group or gives it up, in
which case a spare prompt takes its place (``replace``) or its step shrinks
(``shrink``).

Every ledger transition, data-plane put and clear, and each dataloader
advance with its reservation runs inside a mutation section of the cut.

Multi-turn attempts: the gate hands each finished turn to the pump's
:class:`~rollvault.controller.loop.turn_commits.TurnCommitter`, which stages
and commits it. A dispatched attempt that inherited a committed prefix (a
restore) gets it as its request's ``resume``; an attempt that fails in the
run drops its turns, so its retry starts the episode afresh.

Batches: a model gate's worker returns a whole generation batch at once, and
its attempts resume in one turn of the event loop. The turns they hand over
are committed together (:class:`TurnCommitter`), and the attempts that then
return are sealed together (:class:`~rollvault.controller.loop.tick_batches.TickBatch`):
one mutation section, one ``attempts.jsonl`` write and one dispatch journal
write (its ``returned`` lines) per batch; the seal journal's records follow
after the cut, as for a single seal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollvault.config.schema import OnDroppedPrompt
from rollvault.controller.data.prompt_source import next_prompt, refill_spares
from rollvault.controller.data.sampler import InOrderSampler
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.episodes import logical_id
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    CommittedTurn,
    EpisodeResume,
    FailureKind,
    Gate,
    GateAttemptError,
    PartialTurn,
    attempt_turn_sink,
)
from rollvault.controller.loop.group_version import off_version_reason, receipt_with_version
from rollvault.controller.loop.isolation import RoundIsolation
from rollvault.controller.loop.partials import resume_with_prefix
from rollvault.controller.loop.parts import GroupOrigin, RolloutParts
from rollvault.controller.loop.retry_budget import budget_exhausted, was_interrupted
from rollvault.controller.loop.run_logs import AttemptLogRecord, DropLogRecord
from rollvault.controller.loop.seal_journal import SealRecord, StagedSeal
from rollvault.controller.loop.tick_batches import Handed, TickBatch
from rollvault.controller.loop.turn_commits import TurnCommitter
from rollvault.controller.snapshots.journal_replay import adopt_journaled_seals
from rollvault.controller.snapshots.restorer import RestoreError, RolloutRestorer
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.dataplane.rows import RowView
from rollvault.ledger.datum import DatumSpec
from rollvault.ledger.receipts import validate_receipt
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

_LOG = logging.getLogger("rollvault.rollout")

_FINALIZABLE = frozenset(
    {PromptGroupStatus.READY_TO_FINALIZE, PromptGroupStatus.FINALIZATION_UNKNOWN}
)

_RETRYABLE = frozenset({RolloutAttemptStatus.FAILED, RolloutAttemptStatus.ABANDONED})


class RolloutPump:
    """Reserves, admits and generates prompt groups until the data runs out."""

    def __init__(
        self,
        parts: RolloutParts,
        gate: Gate,
        finalizer: Finalizer,
        *,
        inflight: asyncio.Semaphore,
        capacity: ReplayCapacity,
        dispatch_open: asyncio.Event,
        end_weight_version: dict[str, int],
    ) -> None:
        self._parts = parts
        self._gate = gate
        self._finalizer = finalizer
        self._inflight = inflight
        self._capacity = capacity
        self._dispatch_open = dispatch_open
        self._end_weight_version = end_weight_version
        self._isolation = RoundIsolation()
        self._turns = _RowKeepingSink(TurnCommitter(parts))
        self._seals = TickBatch[_Returned, GateAttemptError | None](self._seal_batch, name="seals")
        self._attempt_lines: list[AttemptLogRecord] | None = None
        """Inside a seal batch: its attempt lines, written at once at its end."""
        self._returned: list[str] | None = None
        """Inside a seal batch: the attempts it returned, one dispatch journal write at its end."""
        self._lines_owner: asyncio.Task[Any] | None = None
        """The seal batch's task (another task's lines are its own to write)."""
        self.failures = Counter[FailureKind]()
        self.dropped_groups = 0

    async def run(self, restorer: RolloutRestorer | None = None) -> None:
        """Generate restored groups first, then fresh ones, until no prompt is left.

        Stopped (cancelled) or done, it returns only once the turn-commit and seal
        batches already started have ended: none runs on past the pump.
        """
        try:
            await self._run(restorer)
        finally:
            await self._turns.drain()
            await self._seals.drain()

    async def _run(self, restorer: RolloutRestorer | None) -> None:
        async with asyncio.TaskGroup() as slots:
            if restorer is not None:

                async def launch(
                    payload: DatumSpec, target_step: int | None, group_id: str
                ) -> None:
                    # Restored groups already hold replay capacity (the restorer took it).
                    await self._inflight.acquire()
                    slots.create_task(self._own_slot(group_id))

                await restorer.redispatch_restored(launch, _refuse_unadmitted)
            while True:
                await self._inflight.acquire()
                await self._capacity.acquire()
                fresh = await self._reserve_next()
                if fresh is None:
                    self._inflight.release()
                    self._capacity.release()
                    break
                slots.create_task(self._own_slot(fresh))
            self._parts.reservation_finished = True
            await self._parts.notify()

    # -- reservation -----------------------------------------------------------------

    async def _reserve_next(self) -> str | None:
        parts = self._parts
        async with parts.changed:
            await parts.changed.wait_for(
                lambda: self._out_of_steps() or parts.sampler.ready_to_admit(parts.trainer_version)
            )
        async with parts.cut.mutation():
            if self._out_of_steps():
                return None
            source = self._next_prompt_source()
            if source is None:
                return None
            epoch, dataset_idx = source
            target_step = parts.sampler.admit(epoch=epoch, trainer_version=parts.trainer_version)
            self._refill_spares()
            group_id = self._reserve(epoch, dataset_idx, target_step)
            await self._adopt_journaled(group_id)
            return group_id

    async def _adopt_journaled(self, group_id: str) -> None:
        """A restore pooled journaled seals of this prompt's lost group: seal with them.

        Inside the reservation's mutation section; the adopted seals are
        journaled again (for the new attempts), so a kill before the next
        snapshot keeps them too.
        """
        parts = self._parts
        if not parts.journaled_seals:
            return
        adopted = await adopt_journaled_seals(parts, group_id)
        if adopted and parts.seal_journal is not None:
            record = parts.ledger.get_group(group_id)
            for index, seal in adopted.items():
                attempt = record.siblings[index].current_attempt
                assert attempt.receipt is not None  # adopt_journaled_seals sealed it
                await self._journal_seal(
                    record,
                    index,
                    _Sealed(
                        receipt=attempt.receipt,
                        staging_keys=list(attempt.staging_keys),
                        reward=seal.reward,
                        mask_sample=seal.mask_sample,
                        reward_checks=seal.reward_checks,
                        reward_log_context=seal.reward_log_context,
                        num_tokens=seal.num_tokens,
                        checks=seal.checks,
                    ),
                    adopted_from=seal.adopted_from or seal.gate_rollout_id,
                )

    def _out_of_steps(self) -> bool:
        # Only a stamping sampler knows which step a fresh group would train in;
        # a windowed run stops reserving when the train pump finishes.
        sampler = self._parts.sampler
        return (
            isinstance(sampler, InOrderSampler)
            and sampler.next_target_step >= self._parts.config.grpo.max_num_steps
        )

    def _next_prompt_source(self) -> tuple[int, int] | None:
        """The next prompt; an epoch's spares drain before the next epoch is drawn."""
        parts = self._parts
        return next_prompt(
            parts.dataloader, parts.spares, max_epochs=parts.config.grpo.max_num_epochs
        )

    def _refill_spares(self) -> None:
        parts = self._parts
        refill_spares(
            parts.dataloader,
            parts.spares,
            wanted=parts.config.rollout.num_spare_prompts,
            max_epochs=parts.config.grpo.max_num_epochs,
        )

    def _reserve(self, epoch: int, dataset_idx: int, target_step: int | None) -> str:
        parts = self._parts
        config = parts.config
        record = parts.ledger.reserve_group(
            parts.cut,
            prompt_id=str(dataset_idx),
            prompt_payload=parts.dataset[dataset_idx],
            expected_generations=config.grpo.num_generations_per_prompt,
            target_step=target_step,
            start_weight_version=parts.trainer_version,
            recovery_granularity=config.rollout.recovery_granularity,
        )
        parts.add_reserved_group(record.group_id, GroupOrigin(epoch=epoch, dataset_idx=dataset_idx))
        if parts.lost_interruptions:
            self._carry_lost_interruptions(record.group_id, epoch, dataset_idx)
        return record.group_id

    def _carry_lost_interruptions(self, group_id: str, epoch: int, dataset_idx: int) -> None:
        """An earlier group of this prompt was lost with interrupted attempts: inherit them."""
        parts = self._parts
        carried = [
            lost
            for lost in parts.lost_interruptions
            if (lost.epoch, lost.dataset_idx) == (epoch, dataset_idx)
        ]
        if not carried:
            return
        parts.ledger.carry_interrupted_attempts(
            parts.cut, group_id, [lost.interrupted_attempt() for lost in carried]
        )
        parts.lost_interruptions = [
            lost for lost in parts.lost_interruptions if lost not in carried
        ]

    # -- one slot ----------------------------------------------------------------------

    async def _own_slot(self, group_id: str) -> None:
        current: str | None = group_id
        try:
            while current is not None:
                if await self._sealed(current) or await self._generate(current):
                    await self._finalizer.finalize(current)
                    return
                current = await self._give_up(current)
        finally:
            self._inflight.release()

    async def _sealed(self, group_id: str) -> bool:
        """Whether a (restored) group needs no generation."""
        return self._parts.ledger.borrowed_group(group_id).status in _FINALIZABLE

    async def _generate(self, group_id: str) -> bool:
        """Run the group's attempts until it is sealed (True) or out of budget (False).

        Before each round the budgets are counted from the ledger
        (:mod:`~rollvault.controller.loop.retry_budget`), so attempts of earlier
        runs count too; failed siblings (a restored group's included) get
        fresh attempts first. A round of a group whose last attempt the
        process's death interrupted runs alone (:mod:`.isolation`).
        """
        rollout = self._parts.config.rollout
        while True:
            record = self._parts.ledger.get_group(group_id)
            spent = budget_exhausted(record, rollout)
            if spent is not None:
                _LOG.warning(
                    "giving up group %s (prompt %s): %s", group_id, record.prompt_id, spent
                )
                return False
            if any(sibling.current_attempt.status in _RETRYABLE for sibling in record.siblings):
                await self._retry(group_id)
            async with self._isolation.round(alone=was_interrupted(record)):
                requests = await self._dispatch(group_id)
                async with asyncio.TaskGroup() as attempts:
                    runs = [attempts.create_task(self._run_attempt(r)) for r in requests]
            if all(run.result() is None for run in runs):
                return True

    async def _dispatch(self, group_id: str) -> list[AttemptRequest]:
        parts = self._parts
        await self._dispatch_open.wait()
        async with parts.cut.mutation():
            record = parts.ledger.get_group(group_id)
            indices = [
                sibling.generation_index
                for sibling in record.siblings
                if sibling.current_attempt.status is RolloutAttemptStatus.RESERVED
            ]
            resumes = await self._episode_resumes(record, indices)
            parts.ledger.mark_group_dispatched(parts.cut, group_id, generation_indices=indices)
            if parts.journal is not None:
                # Before the gate sees them: an attempt that kills the process must be on record.
                origin = parts.group(group_id).origin
                parts.journal.dispatched(
                    group_id=group_id,
                    epoch=origin.epoch,
                    dataset_idx=origin.dataset_idx,
                    attempts=[(i, record.siblings[i].current_attempt.attempt_id) for i in indices],
                )
        payload = dict(record.prompt_payload)
        return [
            AttemptRequest(
                group_id=group_id,
                generation_index=index,
                gate_rollout_id=record.gate_rollout_id(index),
                prompt=payload,
                weight_version=parts.trainer_version,
                resume=resumes.get(index),
            )
            for index in indices
        ]

    async def _episode_resumes(
        self, record: PromptGroupRecoveryRecord, indices: list[int]
    ) -> dict[int, EpisodeResume]:
        """Per sibling to dispatch, how its attempt continues an interrupted episode.

        An attempt whose committed prefix cannot be continued (``restart_only``,
        or its environment state is missing) restarts its episode: the prefix
        and its rows go, and the restore log says so. Inside the cut.
        """
        parts = self._parts
        resumes: dict[int, EpisodeResume] = {}
        for index in indices:
            key = logical_id(record.group_id, index)
            resume, why_not = parts.episodes.resume_for(key, record.siblings[index].current_attempt)
            if why_not is not None:
                parts.partials.resumed.pop(key, None)  # its turn goes with the restart
            else:
                resume = resume_with_prefix(
                    parts.config,
                    parts.partials,
                    record,
                    index,
                    resume,
                    trainer_version=parts.trainer_version,
                )
            if resume is not None:
                resumes[index] = resume
                continue
            if why_not is not None:
                dropped = parts.ledger.restart_episode(
                    parts.cut, record.group_id, generation_index=index
                )
                await parts.data_plane.clear(STAGING_PARTITION, dropped)
                parts.episodes.forget(key)
                _LOG.warning(
                    "restarting the episode of %s from its first turn (%d committed turns "
                    "dropped): %s",
                    key,
                    len(dropped),
                    why_not,
                )
        return resumes

    async def _run_attempt(self, request: AttemptRequest) -> GateAttemptError | None:
        try:
            return await self._record_attempt(request)
        except asyncio.CancelledError:
            # The controller cancelled it (the run stops, or failed elsewhere): it
            # did not kill the process, and a restore must not charge it.
            self._journal_returned(request)
            raise
        finally:
            self._turns.forget(request.gate_rollout_id)

    async def _record_attempt(self, request: AttemptRequest) -> GateAttemptError | None:
        parts = self._parts
        try:
            with attempt_turn_sink(self._turns):
                outcome = await self._gate.run_attempt(request)
        except GateAttemptError as error:
            async with parts.cut.mutation():
                await self._drop_turns(request)
                self._fail_attempt(request, error, num_tokens=0)
            return error
        return await self._seals.submit((request, outcome))

    async def _seal_batch(self, batch: list[Handed[_Returned, GateAttemptError | None]]) -> None:
        """Seal the attempts a generation batch returned, in one mutation section.

        Each seal is applied in the ledger after its rows are in the data plane
        (its turns were committed before its attempt returned); the attempt lines
        and the dispatch journal's ``returned`` lines go out in one write each before
        the cut is released, and the seal journal's records are handed over after
        it, as for one seal.
        """
        parts = self._parts
        journaled: list[tuple[Handed[_Returned, GateAttemptError | None], _Journaled]] = []
        async with parts.cut.mutation():
            self._attempt_lines, self._returned = [], []
            self._lines_owner = asyncio.current_task()
            groups: dict[str, PromptGroupRecoveryRecord] = {}
            try:
                for entry in batch:
                    try:
                        applied = await self._seal_returned(*entry.item, groups)
                    except Exception as error:  # noqa: BLE001 - raised in its own attempt
                        entry.fail(error)
                        continue
                    if isinstance(applied, GateAttemptError):
                        entry.settle(applied)
                    else:
                        journaled.append((entry, applied))
                lines, self._attempt_lines = self._attempt_lines, None
                returned, self._returned = self._returned, None
                if parts.journal is not None:
                    # Inside the cut, as each line was: a snapshot's journal seq covers them.
                    parts.journal.returned_many(returned)
                parts.logs.attempts.write_many(lines)
            finally:
                self._attempt_lines, self._returned, self._lines_owner = None, None, None
        staged: list[SealRecord | StagedSeal] = []
        settled = []
        for entry, (record, sealed) in journaled:
            request = entry.item[0]
            try:
                # ``record`` is the group as it was just before this seal: the seal changes
                # only this sibling's attempt, whose fields the journal takes from ``sealed``.
                seal = await self._staged_seal(
                    record,
                    request.generation_index,
                    sealed,
                    rows=self._turns.rows(request.gate_rollout_id),
                    gate_rollout_id=request.gate_rollout_id,
                )
            except Exception as error:  # noqa: BLE001 - raised in its own attempt
                entry.fail(error)
                continue
            if seal is not None:
                staged.append(seal)
            settled.append(entry)
        if parts.seal_journal is not None and staged:
            # The batch's records in one queue put, in the order the seals were applied.
            parts.seal_journal.seal_many(staged)
        for entry in settled:
            entry.settle(None)

    async def _seal_returned(
        self,
        request: AttemptRequest,
        outcome: AttemptOutcome,
        groups: dict[str, PromptGroupRecoveryRecord],
    ) -> _Journaled | GateAttemptError:
        """Seal one returned attempt, or refuse it as off version (inside the cut).

        ``groups``: the batch's copies of its groups. A copy taken before an earlier
        seal of the batch serves the seal journal as well (a seal changes only its
        own sibling); the version check of a ``prompt_group`` group needs the
        siblings sealed so far, so it takes a fresh one.
        """
        record = groups.get(request.group_id)
        if record is None or record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
            record = groups[request.group_id] = self._parts.ledger.get_group(request.group_id)
        off_version = off_version_reason(record, outcome.weight_version)
        if off_version is not None:
            return await self._refuse_off_version(request, outcome, off_version)
        return record, self._seal(request, outcome)

    async def _journal_seal(
        self,
        record: PromptGroupRecoveryRecord,
        index: int,
        sealed: _Sealed,
        *,
        adopted_from: str | None = None,
    ) -> None:
        """Hand an applied seal to the seal journal: after the cut, the fsync is the writer's."""
        seal = await self._staged_seal(record, index, sealed, adopted_from=adopted_from)
        if seal is not None and self._parts.seal_journal is not None:
            self._parts.seal_journal.seal(seal)

    async def _staged_seal(
        self,
        record: PromptGroupRecoveryRecord,
        index: int,
        sealed: _Sealed,
        *,
        rows: Mapping[str, RowView] | None = None,
        gate_rollout_id: str | None = None,
        adopted_from: str | None = None,
    ) -> StagedSeal | None:
        """The seal journal's record of an applied seal (None: no journal).

        ``rows``: the attempt's staged rows as the gate handed them over; a row
        missing there (a gate that staged its rows itself, an adopted seal) is
        read back from the data plane. ``gate_rollout_id``: the sealed attempt's,
        when the caller has it (the seal was fenced by it); else derived again.
        """
        parts = self._parts
        if parts.seal_journal is None:
            return None
        keys = sealed.staging_keys
        if rows is None or not all(map(rows.__contains__, keys)):
            rows = await parts.data_plane.get(STAGING_PARTITION, keys)
        origin = parts.group(record.group_id).origin
        seal = SealRecord(
            group_id=record.group_id,
            generation_index=index,
            gate_rollout_id=gate_rollout_id or record.gate_rollout_id(index),
            epoch=origin.epoch,
            dataset_idx=origin.dataset_idx,
            target_step=record.target_step,
            receipt=sealed.receipt,
            reward=float(sealed.reward),
            mask_sample=sealed.mask_sample,
            reward_checks=sealed.reward_checks,
            reward_log_context=sealed.reward_log_context,
            rows={},  # encoded on the writer thread: StagedSeal
            num_tokens=sealed.num_tokens,
            checks=sealed.checks,
            adopted_from=adopted_from,
        )
        return StagedSeal(record=seal, rows=rows, keys=list(keys))

    async def _refuse_off_version(
        self, request: AttemptRequest, outcome: AttemptOutcome, reason: str
    ) -> GateAttemptError:
        """Fail an attempt that would mix weight versions in a ``prompt_group`` group.

        An infrastructure failure (the gate split the group, the prompt is not
        at fault); the retry then redoes the whole group. Its staged rows go now.
        """
        error = GateAttemptError(request.gate_rollout_id, FailureKind.INFRA, reason)
        staged = validate_receipt(outcome.receipt, where=request.gate_rollout_id).staging_keys
        await self._parts.data_plane.clear(STAGING_PARTITION, staged)
        await self._drop_turns(request)
        self._fail_attempt(request, error, num_tokens=outcome.num_tokens)
        return error

    async def _drop_turns(self, request: AttemptRequest) -> None:
        """A failed attempt's committed turns go with it: a retry starts the episode afresh.

        Only a kill (restore) continues an episode at its last committed
        turn; inside the cut.
        """
        parts = self._parts
        record = parts.ledger.get_group(request.group_id)
        attempt = record.siblings[request.generation_index].current_attempt
        if record.gate_rollout_id(request.generation_index) == request.gate_rollout_id:
            await parts.data_plane.clear(STAGING_PARTITION, attempt.turn_keys)
        parts.episodes.forget(logical_id(request.group_id, request.generation_index))

    def _fail_attempt(
        self, request: AttemptRequest, error: GateAttemptError, *, num_tokens: int
    ) -> None:
        """Record a failed attempt: ledger, dispatch journal, attempt log (inside the cut)."""
        parts = self._parts
        self.failures[error.kind] += 1
        parts.ledger.mark_sibling_failed(
            parts.cut,
            request.group_id,
            generation_index=request.generation_index,
            gate_rollout_id=request.gate_rollout_id,
            reason=f"{error.kind.value}: {error.reason}",
            failure_kind=AttemptFailureKind(error.kind.value),
        )
        self._journal_returned(request)
        self._log_attempt(request, RolloutAttemptStatus.FAILED, num_tokens, error.reason)

    def _seal(self, request: AttemptRequest, outcome: AttemptOutcome) -> _Sealed:
        """Seal the attempt (inside the cut); returns what the ledger was handed."""
        parts = self._parts
        receipt = receipt_with_version(
            outcome.receipt, outcome.weight_version, gate_rollout_id=request.gate_rollout_id
        )
        staging_keys = list(validate_receipt(outcome.receipt).staging_keys)
        parts.ledger.mark_sibling_sealed(
            parts.cut,
            request.group_id,
            generation_index=request.generation_index,
            gate_rollout_id=request.gate_rollout_id,
            receipt=receipt,
            reward=outcome.reward,
            mask_sample=False,
            reward_checks=outcome.reward_checks,
            reward_log_context=outcome.reward_log_context,
        )
        parts.episodes.forget(logical_id(request.group_id, request.generation_index))
        previous = self._end_weight_version.get(request.group_id, outcome.weight_version)
        self._end_weight_version[request.group_id] = max(previous, outcome.weight_version)
        self._journal_returned(request)
        self._log_attempt(
            request,
            RolloutAttemptStatus.SEALED,
            outcome.num_tokens,
            None,
            reward=outcome.reward,
            checks=outcome.checks,
            staging_keys=list(staging_keys),
        )
        return _Sealed(
            receipt=receipt,
            staging_keys=staging_keys,
            reward=outcome.reward,
            mask_sample=False,
            reward_checks=outcome.reward_checks,
            reward_log_context=outcome.reward_log_context,
            num_tokens=outcome.num_tokens,
            checks=outcome.checks,
        )

    def _journal_returned(self, request: AttemptRequest) -> None:
        journal = self._parts.journal
        if journal is None:
            return
        attempt = _attempt_hex(request.gate_rollout_id)
        if self._returned is not None and asyncio.current_task() is self._lines_owner:
            self._returned.append(attempt)  # a seal batch writes its lines at once
        else:
            journal.returned(attempt)

    async def _retry(self, group_id: str) -> None:
        """Mint fresh attempts; under ``prompt_group`` this also drops the sealed rows."""
        parts = self._parts
        async with parts.cut.mutation():
            before = parts.ledger.get_group(group_id)
            after = parts.ledger.prepare_incomplete_retry(parts.cut, group_id)
            await parts.data_plane.clear(
                STAGING_PARTITION, _sealed_keys(before) - _sealed_keys(after)
            )
            for sibling in before.siblings:
                attempt = sibling.current_attempt
                if attempt.status is RolloutAttemptStatus.SEALED and (
                    after.siblings[sibling.generation_index].current_attempt.attempt_uuid
                    != attempt.attempt_uuid
                ):
                    self._parts.logs.log_discarded_seal(
                        before, sibling.generation_index, "sealed work discarded"
                    )

    # -- giving a group up ---------------------------------------------------------------

    async def _give_up(self, group_id: str) -> str | None:
        """Drop a group for good; returns the replacement group's id, if any."""
        parts = self._parts
        rollout = parts.config.rollout
        per_step = parts.config.grpo.num_prompts_per_step
        self.dropped_groups += 1
        async with parts.cut.mutation():
            record = parts.ledger.get_group(group_id)
            await parts.data_plane.clear(
                STAGING_PARTITION, _sealed_keys(record) | _live_turn_keys(record)
            )
            if record.status is PromptGroupStatus.GENERATING:
                # A restored group may hold fresh attempts that restore minted.
                parts.ledger.abandon_unsealed(parts.cut, group_id)
            parts.ledger.drop_group(parts.cut, group_id)
            for sibling in record.siblings:
                if sibling.current_attempt.status is RolloutAttemptStatus.SEALED:
                    self._parts.logs.log_discarded_seal(
                        record, sibling.generation_index, "sealed work discarded"
                    )
            origin = parts.forget_group(group_id).origin
            step = record.target_step
            must_replace = step is not None and not parts.shortfall.can_shrink(
                step, per_step, rollout.min_step_batch_fraction
            )
            source = None
            if rollout.on_dropped_prompt is OnDroppedPrompt.REPLACE or must_replace:
                source = self._next_prompt_source()
            replacement = None
            if source is not None:
                target = parts.sampler.restamp(
                    step, epoch=source[0], trainer_version=parts.trainer_version
                )
                replacement = self._reserve(source[0], source[1], target)
                await self._adopt_journaled(replacement)
            elif step is not None:
                parts.shortfall.record_loss(step)
            parts.logs.drops.write(
                DropLogRecord(
                    group_id=group_id,
                    sample_id=record.prompt_id,
                    epoch=origin.epoch,
                    target_step=step,
                    replaced=replacement is not None,
                    incarnation=parts.logs.incarnation,
                )
            )
        if replacement is None:
            self._capacity.release()
        await parts.notify()
        return replacement

    # -- evidence ----------------------------------------------------------------------

    def _log_attempt(
        self,
        request: AttemptRequest,
        status: RolloutAttemptStatus,
        num_tokens: int,
        reason: str | None,
        *,
        reward: float | None = None,
        checks: dict[str, bool | float] | None = None,
        staging_keys: list[str] | None = None,
    ) -> None:
        line = AttemptLogRecord(
            gate_rollout_id=request.gate_rollout_id,
            group_id=request.group_id,
            generation_index=request.generation_index,
            status=status,
            num_tokens=num_tokens,
            incarnation=self._parts.logs.incarnation,
            reason=reason,
            reward=reward,
            checks=checks,
            staging_keys=staging_keys,
        )
        if self._attempt_lines is not None and asyncio.current_task() is self._lines_owner:
            self._attempt_lines.append(line)  # a seal batch writes its lines at once
        else:
            self._parts.logs.attempts.write(line)


@dataclass(frozen=True, slots=True)
class _Sealed:
    """What a seal handed the ledger (and the gate counted): the seal journal's record of it."""

    receipt: dict[str, Any]
    staging_keys: list[str]
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None
    reward_log_context: RewardLogContext | None
    num_tokens: int
    checks: dict[str, bool | float] | None


_Returned = tuple[AttemptRequest, AttemptOutcome]
"""An attempt the gate returned, waiting for its seal batch."""

_Journaled = tuple[PromptGroupRecoveryRecord, _Sealed]
"""A seal applied in a batch: the group just before it, and what the ledger was handed."""


class _RowKeepingSink:
    """The pump's turn sink: commits each turn and keeps its row until the attempt ends.

    The seal journal records a sealed attempt's rows; kept here, they need
    not be read back from the data plane (a round trip on TransferQueue).
    """

    def __init__(self, committer: TurnCommitter) -> None:
        self._committer = committer
        self._rows: dict[str, dict[str, RowView]] = {}

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        await self._committer.commit_turn(request, turn)
        self._rows.setdefault(request.gate_rollout_id, {})[turn.key] = turn.row

    async def record_partial(self, request: AttemptRequest, partial: PartialTurn) -> None:
        await self._committer.record_partial(request, partial)

    async def drain(self) -> None:
        """Wait until every commit batch already started has ended."""
        await self._committer.drain()

    def rows(self, gate_rollout_id: str) -> dict[str, RowView]:
        """The rows of the attempt's committed turns, by staging key."""
        return self._rows.get(gate_rollout_id, {})

    def forget(self, gate_rollout_id: str) -> None:
        """The attempt ended (sealed, failed or cancelled)."""
        self._rows.pop(gate_rollout_id, None)


async def _refuse_unadmitted(group_ids: list[str]) -> None:
    """This pump reserves and admits in one mutation, so its snapshots never hold
    groups in phase ``reserved``; a snapshot that does was not written by it."""
    raise RestoreError(
        f"restored groups {group_ids[:5]} are reserved but not admitted; this rollout pump "
        "cannot admit groups it did not reserve"
    )


def _attempt_hex(gate_rollout_id: str) -> str:
    """The attempt UUID (32 hex digits) a gate rollout id ``{group}_g{i}_a{hex}`` names."""
    return gate_rollout_id.rsplit("_a", 1)[1]


def _live_turn_keys(record: PromptGroupRecoveryRecord) -> set[str]:
    """Committed turn rows of the group's live attempts (a restored group's prefixes)."""
    live = (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
    return {
        key
        for sibling in record.siblings
        if sibling.current_attempt.status in live
        for key in sibling.current_attempt.turn_keys
    }


def _sealed_keys(record: PromptGroupRecoveryRecord) -> set[str]:
    return {
        key
        for sibling in record.siblings
        if sibling.current_attempt.status is RolloutAttemptStatus.SEALED
        for key in sibling.current_attempt.staging_keys
    }
