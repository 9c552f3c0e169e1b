"""Restore the rollout parts of a resumed run, once, before the pumps start.

The order matters and follows the data: rows first (the data plane), then
the replay index, then the ledger (attempts the dispatch journal shows in
flight at the death are charged as interrupted failures, see
:mod:`~rollvault.controller.snapshots.crash_evidence`; then
``prepare_for_restart`` turns interrupted attempts into fresh ones and
``finalizing`` groups into ``finalization_unknown``), then the leftovers
nothing references are removed, then spares and cursors, and last the
prompts are rehydrated from the dataset and checked against the identity
recorded at reservation. The rollout pump
then redispatches the restored groups first, under the same semaphores as new
work, while the train pump drains the replay index.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.controller.data.shortfall import SHORTFALL_SCHEMA_VERSION, BatchShortfallState
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.dispatch_journal import (
    DISPATCH_JOURNAL_DIRNAME,
    LostGroupInterruption,
    read_dispatch_journal,
)
from rollvault.controller.loop.episodes import logical_id
from rollvault.controller.loop.finalizer import capture_reward_settings
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import AttemptLogRecord, RestoreLogRecord
from rollvault.controller.loop.trainer import Trainer
from rollvault.controller.snapshots.crash_evidence import CrashEvidence, crash_evidence
from rollvault.controller.snapshots.fact_writer import FactSeed
from rollvault.controller.snapshots.gc_pause import gc_paused_async
from rollvault.controller.snapshots.journal_replay import (
    JournalReplayCounts,
    pool_seal,
    replay_seal_journal,
)
from rollvault.controller.snapshots.ledger_segments import LedgerSeed
from rollvault.controller.snapshots.resume import ResumeSource
from rollvault.controller.snapshots.snapshot_files import (
    DATA_PLANE_DIRNAME,
    LoadedSnapshot,
    SegmentSeed,
    advertised_digests,
    read_recovery_sidecar_file,
    reread_decoded_recovery_sidecar,
    segments_dir_for,
)
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, train_key
from rollvault.ledger.datum import DatumSpec
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME, ParsedRolloutRecoveryState
from rollvault.ledger.statuses import (
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)
from rollvault.tasks.protocols import describe_row, identified_row_fetcher

_LOG = logging.getLogger("rollvault.restore")


class RestoreError(RuntimeError):
    """A snapshot cannot be restored into this run (it disagrees with the run or the data)."""


@dataclass
class RestoreCounts:
    """What a restore kept and what it redoes, logged and written to restores.jsonl."""

    siblings_reused: int = 0
    attempts_redispatched: int = 0
    groups_regenerated: int = 0
    rows_dropped: int = 0
    replay_groups: int = 0
    ledger_groups: int = 0
    attempts_interrupted: int = 0
    """Attempts in flight when the process died, charged to their siblings' budgets."""
    turns_resumed: int = 0
    """Committed turns that interrupted episodes continue from."""
    episodes_resumed: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    episodes_restarted: list[str] = dataclasses.field(default_factory=list)
    """``logical id: why`` of each episode restarted from its first turn."""
    journal: JournalReplayCounts = dataclasses.field(default_factory=JournalReplayCounts)
    """What replaying the seal journal kept."""
    prefixes_resumed: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per logical id, the tokens of the journaled partial turn its fresh attempt continues."""


async def read_recovery_sidecar(
    recovery_path: Path,
    metadata: Mapping[str, Any],
    *,
    master_config: RunConfig,
) -> ParsedRolloutRecoveryState:
    """Read the recovery-ledger sidecar and check it against its data-plane checkpoint.

    ``metadata`` is the data-plane checkpoint's ``user_metadata``: it
    advertises the sidecar's SHA-256, ledger schema and group count, and the
    sidecar must match all three. Its reward settings must match this run's.
    Raises ``SnapshotCorruptError`` or :class:`RestoreError` naming the file.

    Every restore of a snapshot calls it (:meth:`RolloutRestorer.restore`);
    the checks of the file itself are the ones verification runs
    (``read_recovery_sidecar_file``).
    """
    digests = advertised_digests(recovery_path.parent / DATA_PLANE_DIRNAME, metadata)
    parsed = reread_decoded_recovery_sidecar(recovery_path, digests)
    if parsed is None:  # not the bytes verification decoded: decode off the event loop
        parsed = await asyncio.to_thread(read_recovery_sidecar_file, recovery_path, digests)
    check_reward_settings(recovery_path, parsed, master_config)
    return parsed


def check_reward_settings(
    path: Path, recovery: ParsedRolloutRecoveryState, config: RunConfig
) -> None:
    """The sidecar's reward settings must be this run's: sealed rewards are final.

    Decoding refused a sidecar without them (every rollvault run captures
    tokens, see ``decode_recovery_sidecar``). Raises :class:`RestoreError`.
    """
    expected = capture_reward_settings(config.reward)
    if recovery.reward_settings != expected:
        raise RestoreError(
            f"{path}: rewards were captured under {recovery.reward_settings}, "
            f"this run uses {expected}; sealed rewards cannot be re-finalized"
        )


class RolloutRestorer:
    """Restore the parts listed in the module docstring, then hand them to the pumps."""

    def __init__(
        self,
        parts: RolloutParts,
        *,
        trainer: Trainer,
        buffer_capacity: ReplayCapacity,
        resume: ResumeSource,
    ) -> None:
        self._parts = parts
        self._trainer = trainer
        self._capacity = buffer_capacity
        self._resume = resume
        self.counts = RestoreCounts()
        self.restored_group_ids: list[str] = []
        self._identities: dict[str, str] = {}
        self._fetch_row: Callable[[int], tuple[DatumSpec, str]] | None = None
        """Each group's row and identity, from one build when the dataset can (chosen once)."""
        self.segment_seed: SegmentSeed | None = None
        """The restored rows' segments, for the checkpointer's first snapshot to reference."""
        self.ledger_seed: LedgerSeed | None = None
        """The restored ledger records' segments, the same way (a version 6 sidecar only)."""
        self.fact_seed: FactSeed | None = None
        """The restored group facts' segments, the same way (snapshots with group facts only)."""
        self._records: list[PromptGroupRecoveryRecord] = []
        """The restored ledger's groups (``shared_groups``: read-only, they never change)."""

    @gc_paused_async  # a restore builds its state, see gc_pause
    async def restore(self) -> bool:
        """Restore the parts listed in the module docstring.

        Call it once, before the pumps start. Returns whether restore queued
        unfinished groups that :meth:`redispatch_restored` must launch.
        """
        started = time.perf_counter()
        parts = self._parts
        resume = self._resume
        if resume.trainer_dir is not None:
            self._trainer.load_checkpoint(resume.trainer_dir)
        snapshot = resume.snapshot
        async with parts.cut.mutation():
            parts.trainer_version = resume.base_step
            parts.base_step = resume.base_step
            if snapshot is not None:
                snapshot = await self._validate_forest_checkpoint_metadata(snapshot)
                # Lines this start writes come after everything the snapshot saw.
                parts.logs.sequence.value = max(
                    parts.logs.sequence.value, snapshot.controller.log_sequence
                )
                restored_replay_groups = await self._restore_replay_buffer(snapshot)
                self._restore_groups(snapshot)
                await self._restore_recovery_ledger(
                    snapshot, restored_replay_groups=restored_replay_groups
                )
                self._restore_spare_prompts(snapshot)
                self._restore_cursors(snapshot)
                self._validate_sampler_cursor()
                if resume.mode is RestoreMode.TRAINER_CHECKPOINT:
                    await self._queue_replay_groups_for_regeneration()
                await self._drop_orphan_rows()
                await self._rehydrate_prompts(snapshot)
            elif resume.mode is RestoreMode.LATEST:
                if parts.seal_journal is not None:
                    # No snapshot yet: every journaled seal awaits its prompt's new group.
                    self.counts.journal = await replay_seal_journal(
                        parts, parts.seal_journal, from_seq=0
                    )
                self._record_interruptions(journal_seq=0, carried=[])
        self.restored_group_ids = [record.group_id for record in self._records]
        self._count_work()
        self._capacity.take_restored(len(parts.replay) + len(parts.ledger))
        self._log_restore_metrics(time.perf_counter() - started)
        return bool(self.restored_group_ids)

    async def redispatch_restored(
        self,
        launch: Callable[[DatumSpec, int | None, str], Awaitable[None]],
        admit: Callable[[list[str]], Awaitable[Any]],
    ) -> None:
        """Launch every restored unfinished group, in reservation order, before new work.

        The rollout pump passes its own ``launch`` (payload, target step,
        group id), so restored groups take the same in-flight permits as new
        work while the train pump drains the replay index. Groups still in
        phase ``reserved`` go to ``admit`` first.
        """
        reserved = [r.group_id for r in self._records if r.phase is PromptGroupPhase.RESERVED]
        if reserved:
            await admit(reserved)
        for record in self._records:
            await launch(record.prompt_payload, record.target_step, record.group_id)

    # -- the parts, in order ---------------------------------------------------------

    async def _validate_forest_checkpoint_metadata(
        self, snapshot: LoadedSnapshot
    ) -> LoadedSnapshot:
        """The snapshot with its sidecar as the spec's :func:`read_recovery_sidecar` reads it.

        Verification decoded it when choosing the snapshot; reading it again
        here, against the checksum the verified data plane advertises, makes
        the spec's function the guard of every real restore (and refuses a
        file changed since), and checks the reward settings against this run's.
        """
        recovery = await read_recovery_sidecar(
            snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME,
            snapshot.data_plane.user_metadata,
            master_config=self._parts.config,
        )
        return dataclasses.replace(snapshot, recovery=recovery)

    async def _restore_replay_buffer(self, snapshot: LoadedSnapshot) -> int:
        """Rows first, then the canonical groups that index them; returns their count."""
        parts = self._parts
        await parts.data_plane.load_verified(
            snapshot.data_plane, source=snapshot.path / DATA_PLANE_DIRNAME
        )
        if snapshot.segments is not None:
            # Taken before anything else changes the store: its tokens are the loaded rows.
            self.segment_seed = SegmentSeed(
                segments_dir_for(snapshot.path), parts.data_plane.capture(), snapshot.segments
            )
        parts.replay.load_state_dict(snapshot.replay.replay)
        return len(parts.replay)

    def _restore_groups(self, snapshot: LoadedSnapshot) -> None:
        """Every group's origin, and what the finalizer recorded for the canonical ones."""
        if snapshot.facts is not None:
            # The writer compares facts by value: the loaded ones stand for the restored groups.
            self.fact_seed = FactSeed(segments_dir_for(snapshot.path), snapshot.facts)
        recovery = snapshot.recovery
        self._parts.load_groups(
            snapshot.controller.origins,
            rewards=recovery.finalizer_rewards_by_group,
            metrics=recovery.finalizer_metrics_by_group,
            gate_rollout_ids=snapshot.replay.canonical_attempts,
        )

    async def _restore_recovery_ledger(
        self, snapshot: LoadedSnapshot, *, restored_replay_groups: int
    ) -> None:
        """Unfinished groups, with interrupted attempts turned into fresh ones."""
        parts = self._parts
        parts.ledger.load_parsed_state(parts.cut, snapshot.recovery)
        if snapshot.ledger_index is not None:
            # Shared before anything changes them, so that their siblings lists stand
            # for the loaded records (see ledger_segments).
            self.ledger_seed = LedgerSeed(
                segments_dir_for(snapshot.path),
                parts.ledger.shared_groups(),
                snapshot.ledger_index,
                snapshot.ledger_chains,
            )
        if self._resume.mode is RestoreMode.LATEST:
            for seal in snapshot.controller.pooled_seals:
                pool_seal(parts, seal)  # before the journal's own: a newer seal replaces
        if self._resume.mode is RestoreMode.LATEST and parts.seal_journal is not None:
            # Before crash evidence and prepare_for_restart: a replayed attempt is sealed.
            self.counts.journal = await replay_seal_journal(
                parts, parts.seal_journal, from_seq=snapshot.controller.seal_journal_seq
            )
        # Copy-on-write: the state before the restart, of the groups whose sealed
        # siblings it may discard (prompt_group); a capture of every group would
        # make each group the restart changes a copy.
        before = parts.ledger.capture(
            [
                record.group_id
                for record in parts.ledger.borrowed_groups()
                if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP
            ]
        )
        evidence = None
        if self._resume.mode is RestoreMode.LATEST:
            evidence = self._crash_evidence(journal_seq=snapshot.controller.dispatch_journal_seq)
        if evidence is None:
            parts.ledger.prepare_for_restart(parts.cut)
        else:
            # The interruptions recorded, then the restart's replacements, in one pass
            # that copies each group the seed shares once (see restart_interrupted).
            parts.ledger.restart_interrupted(parts.cut, evidence.in_ledger)
            self._log_interruptions(evidence, carried=snapshot.controller.lost_interruptions)
        self._restore_episodes(snapshot)
        self._restore_prefixes()
        self._records = parts.ledger.shared_groups()
        self._log_discarded_seals(before)
        await self._resolve_finalization_unknown()
        _LOG.debug(
            "ledger restored: %d unfinished groups beside %d canonical ones",
            len(parts.ledger),
            restored_replay_groups,
        )

    def _restore_episodes(self, snapshot: LoadedSnapshot) -> None:
        """The environment's rollouts: each continued episode's state, or its restart.

        ``prepare_for_restart`` gave every fresh attempt of a ``sibling`` group
        the committed turns of the attempt it replaces. Each keeps them when
        the snapshot holds its environment state at that revision and its
        restore class allows it; otherwise its episode restarts at its first
        turn (said in the restore log) and the orphan pass drops the rows.
        """
        parts = self._parts
        parts.episodes.load(snapshot.env_rollouts.episodes)
        for record in parts.ledger.shared_groups():
            for sibling in record.siblings:
                attempt = sibling.attempts[-1]  # the current one (no property call per sibling)
                if attempt.status is not RolloutAttemptStatus.RESERVED or not attempt.turn_keys:
                    continue
                key = logical_id(record.group_id, sibling.generation_index)
                resume, why_not = parts.episodes.resume_for(key, attempt)
                if not parts.config.rollout.turn_level_restore:
                    resume, why_not = None, "rollout.turn_level_restore is false"
                if resume is not None:
                    self.counts.turns_resumed += len(resume.turn_keys)
                    self.counts.episodes_resumed[key] = list(resume.turn_keys)
                    continue
                parts.ledger.restart_episode(
                    parts.cut, record.group_id, generation_index=sibling.generation_index
                )
                parts.episodes.forget(key)
                self.counts.episodes_restarted.append(f"{key}: {why_not}")
                _LOG.warning("restarting the episode of %s from its first turn: %s", key, why_not)

    def _restore_prefixes(self) -> None:
        """Keep each journaled partial turn only for a fresh attempt that continues at it.

        Replay matched the partial to its (interrupted) attempt; ``prepare_for_restart``
        then gave the sibling a fresh attempt. It continues the partial's turn only when
        it holds exactly the turns before it (an episode restarted from its first turn
        drops a later turn's prefix).
        """
        parts = self._parts
        resumed = parts.partials.resumed
        for key, prefix in list(resumed.items()):
            group_id, _, index = key.rpartition("_g")
            record = parts.ledger.get_group(group_id) if group_id in parts.ledger else None
            attempt = record.siblings[int(index)].current_attempt if record else None
            if (
                attempt is None
                or attempt.status is not RolloutAttemptStatus.RESERVED
                or len(attempt.turn_keys) != prefix.turn_index
            ):
                del resumed[key]
                continue
            self.counts.prefixes_resumed[key] = len(prefix.token_ids)

    def _record_interruptions(
        self, *, journal_seq: int, carried: list[LostGroupInterruption]
    ) -> None:
        """Charge the attempts the process's death interrupted (``crash_evidence``).

        ``journal_seq`` is where the restored snapshot reflects the dispatch
        journal; ``carried`` are the lost groups' interruptions it kept. (A
        restore of a snapshot records them with ``restart_interrupted``.)
        """
        parts = self._parts
        evidence = self._crash_evidence(journal_seq=journal_seq)
        if evidence is None:
            return
        for group_id, interrupted in evidence.in_ledger.items():
            parts.ledger.mark_attempts_interrupted(parts.cut, group_id, interrupted)
        self._log_interruptions(evidence, carried=carried)

    def _crash_evidence(self, *, journal_seq: int) -> CrashEvidence | None:
        """The attempts the dispatch journal shows in flight at the death, after
        ``journal_seq`` (None: the run keeps no journal)."""
        parts = self._parts
        if parts.journal is None:
            return None
        tail = read_dispatch_journal(
            Path(parts.config.checkpointing.checkpoint_dir) / DISPATCH_JOURNAL_DIRNAME,
            after_seq=journal_seq,
        )
        reason = (
            f"interrupted: in flight when the process died (found by start "
            f"{parts.logs.incarnation})"
        )
        # Crash evidence reads every group and keeps none of them: borrowed, not
        # frozen (frozen, each group it finds would be copied whole when recorded).
        return crash_evidence(parts.ledger.borrowed_groups(), tail, reason=reason)

    def _log_interruptions(
        self, evidence: CrashEvidence, *, carried: list[LostGroupInterruption]
    ) -> None:
        """Once recorded: their attempts-log lines, and the lost groups' interruptions kept."""
        parts = self._parts
        # One write for thousands of lines, each built once in its final form.
        parts.logs.attempts.write_stamped(self._interruption_lines(evidence))
        parts.lost_interruptions = [*carried, *evidence.lost]
        self.counts.attempts_interrupted = evidence.count

    def _interruption_lines(self, evidence: CrashEvidence) -> list[AttemptLogRecord]:
        """The attempts log's line of each interrupted attempt, ``seq`` set, in the
        evidence's order: the restored groups' attempts, then the lost groups'."""
        incarnation = self._parts.logs.incarnation
        failed = RolloutAttemptStatus.FAILED
        reason = "interrupted: in flight when the process died"
        # (group, sibling, the attempt's 32 hex digits): from the UUID's ``int`` slot, as
        # its ``.hex`` property gives them, for the restored groups; as journaled for the
        # lost ones.
        interrupted = itertools.chain(
            (
                (group_id, attempt.generation_index, f"{attempt.attempt_uuid.int:032x}")
                for group_id, attempts in evidence.in_ledger.items()
                for attempt in attempts
            ),
            ((lost.group_id, lost.generation_index, lost.attempt_uuid) for lost in evidence.lost),
        )
        seqs = self._parts.logs.attempts.take_seqs(evidence.count)
        lines = [
            AttemptLogRecord(
                gate_rollout_id=f"{group_id}_g{index}_a{attempt_hex}",
                group_id=group_id,
                generation_index=index,
                status=failed,
                num_tokens=0,
                incarnation=incarnation,
                reason=reason,
                seq=seq,
            )
            for (group_id, index, attempt_hex), seq in zip(interrupted, seqs, strict=True)
        ]
        return lines

    def _restore_spare_prompts(self, snapshot: LoadedSnapshot) -> None:
        """Spares were pulled from the dataloader and never dispatched; only the
        snapshot holds them, and the restored dataloader resumes past them."""
        self._parts.spares.load_state_dict(snapshot.spares)

    def _restore_cursors(self, snapshot: LoadedSnapshot) -> None:
        parts = self._parts
        controller = snapshot.controller
        parts.sampler.load_state_dict(controller.sampler)
        parts.dataloader.load_state_dict(controller.dataloader)
        parts.shortfall.load_state_dict(
            BatchShortfallState(
                schema_version=SHORTFALL_SCHEMA_VERSION, losses=snapshot.recovery.batch_shortfall
            )
        )

    async def _resolve_finalization_unknown(self) -> None:
        """Whether a ``finalization_unknown`` group was published is whether its canonical
        rows exist (DESIGN), never whether the replay index lists it, so the two cannot
        disagree.

        All N rows: published. Listed in the replay index, the group leaves the
        ledger and trains from them. Not listed, the rows are kept and the
        rollout pump finalizes the group again: finalization is deterministic
        (the same staged rows, sealed rewards and reward settings), so it puts
        the very same rows, a no-op, and only completes the bookkeeping; rows
        that differ are refused by the data plane. Fewer rows: a torn
        publication. They are cleared and the group finalized again, unlisted
        first if the index listed it (verification refuses such a snapshot, so
        only a snapshot handed in unverified gets here).
        """
        parts = self._parts
        for record in self._records:
            if record.status is not PromptGroupStatus.FINALIZATION_UNKNOWN:
                continue
            keys = self._train_keys(record.group_id)
            published = all(parts.data_plane.has(TRAIN_PARTITION, key) for key in keys)
            listed = record.group_id in parts.replay
            if published and listed:
                parts.ledger.discard_group(parts.cut, record.group_id)
            elif not published:
                if listed:
                    parts.replay.remove(record.group_id)
                    parts.add_reserved_group(
                        record.group_id, parts.forget_group(record.group_id).origin
                    )
                await parts.data_plane.clear(TRAIN_PARTITION, keys)
        self._records = [record for record in self._records if record.group_id in parts.ledger]

    def _log_discarded_seals(self, before: RolloutRecoveryLedger) -> None:
        """Log sealed siblings that ``prepare_for_restart`` abandoned (``prompt_group``)."""
        parts = self._parts
        for new in self._records:
            if new.recovery_granularity is not RecoveryGranularity.PROMPT_GROUP:
                continue  # sibling granularity never discards a sealed sibling
            old = before.get_group(new.group_id)
            for sibling in old.siblings:
                attempt = sibling.current_attempt
                replaced = new.siblings[sibling.generation_index].current_attempt
                if attempt.status is RolloutAttemptStatus.SEALED and (
                    replaced.attempt_uuid != attempt.attempt_uuid
                ):
                    parts.logs.log_discarded_seal(
                        old,
                        sibling.generation_index,
                        "sealed work discarded on restart (prompt_group)",
                    )

    def _validate_sampler_cursor(self) -> None:
        """Require the sampler cursor to cover every restored target step."""
        parts = self._parts
        steps = [record.target_step for record in self._records]
        steps += [entry.target_step for entry in parts.replay]
        parts.sampler.check_cursor_covers(steps)

    async def _queue_replay_groups_for_regeneration(self) -> None:
        """The ``trainer_checkpoint`` baseline: throw every restored rollout away.

        Canonical and unfinished groups alike become fresh prompt work with
        the same prompt and target step, as a framework without rollout
        snapshots would redo them.
        """
        parts = self._parts
        stale: list[tuple[str, int | None]] = []
        for entry in list(parts.replay):
            parts.replay.remove(entry.group_id)
            await parts.data_plane.clear(TRAIN_PARTITION, self._train_keys(entry.group_id))
            stale.append((entry.group_id, entry.target_step))
        for record in self._records:
            if record.status is PromptGroupStatus.GENERATING:
                parts.ledger.abandon_unsealed(parts.cut, record.group_id)
            parts.ledger.drop_group(parts.cut, record.group_id)
            stale.append((record.group_id, record.target_step))
        for group_id, target_step in stale:
            origin = parts.forget_group(group_id).origin
            fresh = parts.ledger.reserve_group(
                parts.cut,
                prompt_id=str(origin.dataset_idx),
                prompt_payload=parts.dataset[origin.dataset_idx],
                expected_generations=parts.config.grpo.num_generations_per_prompt,
                target_step=target_step,
                start_weight_version=parts.trainer_version,
                recovery_granularity=parts.config.rollout.recovery_granularity,
            )
            parts.add_reserved_group(fresh.group_id, origin)
            self.counts.groups_regenerated += 1
        self._records = parts.ledger.groups()

    async def _drop_orphan_rows(self) -> None:
        """Remove rows that neither the ledger nor the replay index references."""
        parts = self._parts
        staged = set(parts.data_plane.keys(STAGING_PARTITION))
        orphan_staging = staged - parts.ledger.expected_staging_keys()
        wanted_train = {key for entry in parts.replay for key in self._train_keys(entry.group_id)}
        # A finalization_unknown group still here was published (its rows decided).
        wanted_train |= {
            key
            for record in self._records
            if record.status is PromptGroupStatus.FINALIZATION_UNKNOWN
            for key in self._train_keys(record.group_id)
        }
        orphan_train = set(parts.data_plane.keys(TRAIN_PARTITION)) - wanted_train
        await parts.data_plane.clear(STAGING_PARTITION, orphan_staging)
        await parts.data_plane.clear(TRAIN_PARTITION, orphan_train)
        self.counts.rows_dropped += len(orphan_staging) + len(orphan_train)

    async def _rehydrate_prompts(self, snapshot: LoadedSnapshot) -> None:
        """Bind each ledger group's prompt, resolved from the stable map-style dataset.

        Assumes the dataset has integer ``__getitem__`` and keeps its order
        across checkpoint and restart; :meth:`_load_recovery_prompt` checks it.
        """
        parts = self._parts
        self._identities = snapshot.controller.prompt_identities
        self._fetch_row = identified_row_fetcher(parts.dataset)
        bound = []
        for record in self._records:
            payload = await self._load_recovery_prompt(
                group_id=record.group_id, sample_id=record.prompt_ref.sample_id
            )
            parts.ledger.bind_runtime_prompt(parts.cut, record.group_id, payload)
            bound.append(msgspec.structs.replace(record, runtime_prompt_payload=payload))
        self._records = bound

    async def _load_recovery_prompt(self, *, group_id: str, sample_id: str) -> DatumSpec:
        """Resolve one stable dataset prompt reference and check it is the same prompt."""
        parts = self._parts
        origin = parts.group(group_id).origin
        if str(origin.dataset_idx) != sample_id:
            raise RestoreError(
                f"group {group_id!r}: ledger sample id {sample_id!r} disagrees with its recorded "
                f"dataset index {origin.dataset_idx}"
            )
        recorded = self._identities.get(group_id)
        if recorded is None:
            return parts.dataset[origin.dataset_idx]
        fetch = self._fetch_row or identified_row_fetcher(parts.dataset)
        payload, identity = fetch(origin.dataset_idx)
        if identity != recorded:
            raise RestoreError(
                f"group {group_id!r}: {describe_row(parts.dataset, origin.dataset_idx)} no "
                "longer holds the prompt it was reserved with (the dataset changed order or "
                "content)"
            )
        return payload

    # -- accounting -------------------------------------------------------------------

    def _train_keys(self, group_id: str) -> list[str]:
        per_group = self._parts.config.grpo.num_generations_per_prompt
        return [train_key(group_id, index) for index in range(per_group)]

    def _count_work(self) -> None:
        parts = self._parts
        self.counts.replay_groups = len(parts.replay)
        self.counts.ledger_groups = len(parts.ledger)
        # Local counters and each sibling's last attempt read directly (not the
        # current_attempt property): ~16k siblings per restore at 1,024 x 16.
        reused = redispatched = 0
        for record in self._records:
            for sibling in record.siblings:
                status = sibling.attempts[-1].status
                if status is RolloutAttemptStatus.SEALED:
                    reused += 1
                elif status is RolloutAttemptStatus.RESERVED:
                    redispatched += 1
        self.counts.siblings_reused += reused
        self.counts.attempts_redispatched += redispatched

    def _log_restore_metrics(self, seconds: float) -> None:
        parts = self._parts
        snapshot = self._resume.snapshot
        counts = self.counts
        _LOG.info(
            "restored %s in %.3fs: %d canonical groups, %d unfinished groups, %d siblings reused, "
            "%d attempts to redispatch (%d interrupted by the death), %d groups regenerated, "
            "%d orphan rows dropped, %d committed turns resumed, %d episodes restarted",
            snapshot.path if snapshot else "nothing",
            seconds,
            counts.replay_groups,
            counts.ledger_groups,
            counts.siblings_reused,
            counts.attempts_redispatched,
            counts.attempts_interrupted,
            counts.groups_regenerated,
            counts.rows_dropped,
            counts.turns_resumed,
            len(counts.episodes_restarted),
        )
        parts.logs.restores.write(
            RestoreLogRecord(
                incarnation=parts.logs.incarnation,
                restore_mode=self._resume.mode.value,
                snapshot=str(snapshot.path) if snapshot else None,
                restored_seq=snapshot.controller.log_sequence if snapshot else 0,
                base_train_step=self._resume.base_step,
                canonical_group_ids=[entry.group_id for entry in parts.replay],
                siblings_reused=counts.siblings_reused,
                attempts_redispatched=counts.attempts_redispatched,
                groups_regenerated=counts.groups_regenerated,
                rows_dropped=counts.rows_dropped,
                seconds=seconds,
                attempts_interrupted=counts.attempts_interrupted,
                turns_resumed=counts.turns_resumed,
                episodes_resumed=dict(counts.episodes_resumed),
                episodes_restarted=list(counts.episodes_restarted),
                journal_records=counts.journal.records,
                journal_seals_replayed=counts.journal.seals_replayed,
                journal_seals_unmatched=counts.journal.seals_unmatched,
                journal_damage=counts.journal.damage,
                prefix_tokens_resumed=sum(counts.prefixes_resumed.values()),
                prefixes_resumed=dict(counts.prefixes_resumed),
                journal_partials_pooled=counts.journal.partials_pooled,
                skipped=[f"{path}: {reason}" for path, reason in self._resume.skipped],
            )
        )
