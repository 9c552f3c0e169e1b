"""The checkpointer: periodic rollout snapshots and trainer checkpoints.

A snapshot is taken in two phases. Inside the exclusive section of the
mutation cut, :func:`take_cut_capture` takes an immutable view of the
in-memory state (a copy-on-write view of the ledger, the replay index,
spares, cursors, shortfall, and a reference view of the live data-plane
rows): no file I/O, no encoding, O(groups) work. After the cut is released,
worker threads build the sidecar from that view (:func:`build_snapshot`),
encode and write the files, and the durable layer commits them atomically.

Snapshots are anchored to the last durable trainer checkpoint (``step_<N>``,
or ``bootstrap`` before the first). They describe the run *as of that
checkpoint's trainer version*: groups trained since then go back into the
replay index (``rolled_back_train_group_count``), with their rows kept, so a
restore, which loads the trainer from ``step_<N>``, trains them again in the
same steps.

A write that fails (disk full, I/O error) leaves what was committed before
it intact. A failed periodic snapshot is a warning on stderr (logger
``rollvault.checkpointer``) and is retried with a doubling wait
(:mod:`.snapshot_schedule`); ``max_consecutive_failures`` in a row raise
:class:`SnapshotsFailingError`. A failed trainer checkpoint raises
:class:`TrainerCheckpointWriteError` at once: the step it would have made
durable is not, and training on would only widen the gap. Either message
names the cause and the newest good state a restart resumes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from rollvault.controller.data.dataloader import DataLoaderState
from rollvault.controller.data.replay_index import ReplayEntry, ReplayIndexState
from rollvault.controller.data.sampler import SamplerState
from rollvault.controller.data.shortfall import SparePromptsState
from rollvault.controller.loop.dispatch_journal import LostGroupInterruption
from rollvault.controller.loop.episodes import EpisodeState, owned_entries
from rollvault.controller.loop.finalizer import capture_reward_settings
from rollvault.controller.loop.io_failures import (
    SnapshotsFailingError,
    TrainerCheckpointWriteError,
)
from rollvault.controller.loop.partials import carry_live_partials
from rollvault.controller.loop.parts import GroupEntry, GroupOrigin, RolloutParts, group_entry
from rollvault.controller.loop.seal_journal import SealRecord
from rollvault.controller.loop.trainer import Trainer
from rollvault.controller.snapshots.anchor_writer import AnchorWriter
from rollvault.controller.snapshots.fact_writer import FactSeed, FactSegmentWriter
from rollvault.controller.snapshots.ledger_segments import LedgerSeed, LedgerSegmentWriter
from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_SCHEMA_VERSION,
    ENV_ROLLOUTS_SCHEMA_VERSION,
    REPLAY_BUFFER_SCHEMA_VERSION,
    ControllerStateFile,
    EnvRolloutsFile,
    ReplayBufferFile,
    RolloutStateCapture,
    SegmentSeed,
    write_snapshot_payload,
)
from rollvault.controller.snapshots.snapshot_schedule import SnapshotSchedule, interval_for
from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.interface import TRAIN_PARTITION, train_key
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.bootstrap import prune_bootstrap_snapshots
from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, SEGMENTS_DIRNAME
from rollvault.durable.manifest_schema import (
    ROLLOUT_SNAPSHOT_SCHEMA_VERSION,
    RolloutSnapshotManifest,
    write_snapshot_manifest,
)
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.durable.trainer_checkpoints import (
    prune_trainer_checkpoints,
    publish_trainer_checkpoint,
    trainer_checkpoint_path,
)
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.sidecar import build_sidecar_envelope
from rollvault.tasks.protocols import PromptDataset

_LOG = logging.getLogger("rollvault.checkpointer")

TRAINER_STATE_DIRNAME = "trainer"
TRAINER_ROLLOUT_STATE_DIRNAME = "rollout_state"
"""The full rollout snapshot taken with a trainer checkpoint, outside
``rollout_snapshots/`` so that snapshot retention never removes it."""


@dataclass(frozen=True)
class CutCapture:
    """What must be copied while the cut is held: references and O(groups) copies only.

    The ledger is a copy-on-write capture; rows, replay entries and group
    entries are immutable or never changed in place, so references suffice.
    """

    base_step: int
    rolled_back: tuple[ReplayEntry, ...]
    replay: ReplayIndexState
    ledger: RolloutRecoveryLedger
    shortfall: dict[int, int]
    groups: dict[str, GroupEntry]
    spares: SparePromptsState
    sampler: SamplerState
    dataloader: DataLoaderState
    data_plane: DataPlaneCapture
    mutation_version: int
    log_sequence: int
    journal_seq: int
    seal_journal_seq: int
    pooled_seals: tuple[SealRecord, ...]
    lost_interruptions: tuple[LostGroupInterruption, ...]
    episodes: dict[str, EpisodeState]


def take_cut_capture(parts: RolloutParts, *, base_step: int | None = None) -> CutCapture:
    """Copy the rollout state; call inside ``cut.checkpoint()``, keep it short.

    ``base_step`` defaults to the last trainer checkpoint; a trainer
    checkpoint being taken now passes the current trainer version, and then
    nothing is rolled back.
    """
    parts.ledger.assert_checkpoint_safe()
    return CutCapture(
        base_step=parts.base_step if base_step is None else base_step,
        rolled_back=tuple(parts.trained_since_checkpoint) if base_step is None else (),
        replay=parts.replay.state_dict(),
        ledger=parts.ledger.capture(),
        shortfall=parts.shortfall.as_dict(),
        groups=dict(parts.groups),
        spares=parts.spares.state_dict(),
        sampler=parts.sampler.state_dict(),
        dataloader=parts.dataloader.state_dict(),
        data_plane=parts.data_plane.capture(),
        mutation_version=parts.cut.mutation_version,
        log_sequence=parts.logs.sequence.value,
        journal_seq=parts.journal.seq if parts.journal is not None else 0,
        seal_journal_seq=(
            parts.seal_journal.snapshot_seq() if parts.seal_journal is not None else 0
        ),
        pooled_seals=tuple(
            seal for pool in parts.journaled_seals.values() for seal in pool.values()
        ),
        lost_interruptions=tuple(parts.lost_interruptions),
        episodes=parts.episodes.capture(),
    )


class PromptIdentities:
    """Each group's prompt identity (a digest of its prompt), computed once per group.

    A snapshot names the identity of every group it holds: up to a trainer
    checkpoint's worth of trained groups, all but a few unchanged since the
    last snapshot. A group's origin never changes, so neither does its identity.
    Used by one snapshot build at a time (the checkpointer's lock).
    """

    def __init__(self) -> None:
        self._by_group: dict[str, str] = {}

    def of(self, dataset: PromptDataset, origins: dict[str, GroupOrigin]) -> dict[str, str]:
        """The identities of ``origins``' groups; only groups new since the last call are hashed."""
        known = self._by_group
        identities = {}
        for group_id, origin in origins.items():
            identity = known.get(group_id)
            identities[group_id] = (
                identity if identity is not None else dataset.identity(origin.dataset_idx)
            )
        self._by_group = identities  # forgets the groups gone since the last call
        return identities


def build_snapshot(
    cut: CutCapture,
    parts: RolloutParts,
    *,
    fingerprint: str | None,
    identities: PromptIdentities | None = None,
) -> RolloutStateCapture:
    """Turn a :class:`CutCapture` into everything a snapshot writes; outside the cut.

    Reads only what never changes from ``parts`` (config, dataset, sampler kind).
    ``identities``: the checkpointer's cache of prompt identities (None: hash every one).
    """
    entries = cut.rolled_back + cut.replay.entries
    canonical = {entry.group_id for entry in entries}
    grouped = canonical | set(cut.ledger.group_ids())
    # The files keep one map per kind (their format predates the group entries).
    finalized = {g: group_entry(cut.groups, g).finalization() for g in canonical}
    origins = {g: group_entry(cut.groups, g).origin for g in grouped}
    if identities is None:
        identities = PromptIdentities()
    # The ledger's records go to ledger segments as they are (shared copy-on-write:
    # they never change), each encoded only if it changed since the last snapshot.
    records = tuple(r for r in cut.ledger.shared_groups() if r.group_id not in canonical)
    recovery = build_sidecar_envelope(
        batch_shortfall=cut.shortfall,
        sampler_stamps_target_steps=parts.sampler.stamps_target_steps,
        finalizer_metrics_by_group={g: f.metrics_dict() for g, f in finalized.items()},
        finalizer_rewards_by_group={g: list(f.rewards) for g, f in finalized.items()},
        reward_settings=capture_reward_settings(parts.config.reward),
    )
    return RolloutStateCapture(
        manifest=RolloutSnapshotManifest(
            schema_version=ROLLOUT_SNAPSHOT_SCHEMA_VERSION,
            base_train_step=cut.base_step,
            trainer_version=cut.base_step,
            current_epoch=cut.sampler.epoch,
            sampler_dispatch_index=cut.sampler.sampler_dispatch_index,
            mutation_version=cut.mutation_version,
            rolled_back_train_group_count=len(cut.rolled_back),
            bootstrap_fingerprint=fingerprint,
            next_nemo_gym_task_index=None,
        ),
        recovery_state=recovery,
        replay=ReplayBufferFile(
            schema_version=REPLAY_BUFFER_SCHEMA_VERSION,
            replay=ReplayIndexState(schema_version=cut.replay.schema_version, entries=entries),
            canonical_attempts={g: list(f.gate_rollout_ids) for g, f in finalized.items()},
        ),
        spares=cut.spares,
        controller=ControllerStateFile(
            schema_version=CONTROLLER_STATE_SCHEMA_VERSION,
            sampler=cut.sampler,
            dataloader=cut.dataloader,
            origins=origins,
            prompt_identities=identities.of(parts.dataset, origins),
            log_sequence=cut.log_sequence,
            dispatch_journal_seq=cut.journal_seq,
            seal_journal_seq=cut.seal_journal_seq,
            pooled_seals=list(cut.pooled_seals),
            lost_interruptions=list(cut.lost_interruptions),
        ),
        data_plane=cut.data_plane,
        generations_per_group=parts.config.grpo.num_generations_per_prompt,
        finalized=finalized,
        env_rollouts=EnvRolloutsFile(
            schema_version=ENV_ROLLOUTS_SCHEMA_VERSION,
            episodes=owned_entries(cut.episodes, cut.ledger),
            next_nemo_gym_task_index=None,
        ),
        ledger_records=records,
    )


class SnapshotStats:
    """What the checkpointer did, for logs and benchmarks."""

    def __init__(self) -> None:
        self.snapshots = 0
        self.skipped = 0
        self.failures = 0
        """Periodic or final snapshots that failed and were left for a later try."""
        self.trainer_checkpoints = 0
        self.bytes_written = 0
        self.cut_hold_seconds: list[float] = []
        self.write_seconds: list[float] = []


class Checkpointer:
    """Writes rollout snapshots every interval (:func:`interval_for`) and trainer
    checkpoints every ``save_period`` steps, one at a time, under ``checkpoint_dir``."""

    def __init__(self, parts: RolloutParts, trainer: Trainer, *, fingerprint: str | None) -> None:
        self._parts = parts
        self._trainer = trainer
        self._fingerprint = fingerprint
        self._checkpoint_dir = Path(parts.config.checkpointing.checkpoint_dir)
        self._settings = parts.config.rollout_checkpointing
        self._lock = asyncio.Lock()
        self._stopping = False
        self._wake = asyncio.Event()
        """Set by :meth:`stop` and by the seal journal's growth alarm: :meth:`run_periodic`
        looks again at what is due."""
        self._journal_failure_seen = False
        self._journal_tried_at = 0
        """The seal journal's ``bytes_appended`` at the last periodic try."""
        self._last_version: int | None = None
        self._identities = PromptIdentities()
        self._committed_journal_seq = 0
        self._rows = AnchorWriter(SegmentedWriter)
        self._ledger = AnchorWriter(LedgerSegmentWriter)
        self._facts = AnchorWriter(FactSegmentWriter)
        self._schedule = SnapshotSchedule(
            interval_s=self._interval_s(),
            max_consecutive_failures=self._settings.max_consecutive_failures,
        )
        self.stats = SnapshotStats()

    def seed_segments(
        self,
        seed: SegmentSeed | None,
        *,
        ledger: LedgerSeed | None = None,
        facts: FactSeed | None = None,
    ) -> None:
        """Let the first snapshot reference the rows (and ledger records, group facts)
        restore loaded.

        Used only if that snapshot is among the anchor's (not a trainer
        checkpoint's own): else the first snapshot writes every row, record and fact.
        """
        self._rows.seed(seed)
        self._ledger.seed(ledger)
        self._facts.seed(facts)

    def anchor(self) -> Path:
        """The directory whose ``rollout_snapshots/`` takes the next snapshot."""
        if self._parts.base_step == 0:
            return self._checkpoint_dir / BOOTSTRAP_DIRNAME
        return trainer_checkpoint_path(self._checkpoint_dir, self._parts.base_step)

    async def run_periodic(self) -> None:
        """Snapshot every ``interval_s`` seconds while anything changed, until :meth:`stop`.

        The interval counts from the newest committed state, a trainer
        checkpoint's included (:class:`SnapshotSchedule`): a snapshot right after
        one would write the same state again. With the seal journal on, one is
        also due as soon as the journal grew ``journal.snapshot_after_mib`` since
        that state (it bounds a restore's replay), and once when the journal
        stops taking records (a snapshot then keeps what it held). Stopping waits
        for a snapshot being written to finish: cancelling would leave its worker
        thread writing while the next snapshot starts. After failures the wait doubles.
        """
        journal = self._parts.seal_journal
        try:
            self._schedule.start()
            while not self._stopping:
                self._wake.clear()
                wait_s = self._schedule.due_in_s()
                if wait_s > 0 and not self._journal_due():
                    # Woken at the old due time after a trainer checkpoint moved it: wait again.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait_s)
                    continue
                if journal is not None:
                    self._journal_tried_at = journal.bytes_appended
                if await self.snapshot_if_changed() is not None:
                    self._prune_journal()
                self._schedule.tried()
        finally:
            if journal is not None:
                journal.clear_growth_alarm()

    def _journal_due(self) -> bool:
        """Whether the seal journal makes a periodic snapshot due now, and else sets its
        alarm for when it will: ``snapshot_after_mib`` journaled since the newest committed
        state and since the last try (a skipped or failed one must not make the next due
        at once), or the journal just stopped taking records."""
        journal = self._parts.seal_journal
        if journal is None:
            return False
        if journal.failure is not None:
            first = not self._journal_failure_seen
            self._journal_failure_seen = True
            self._schedule.interval_s = self._interval_s()
            return first
        limit = int(self._settings.journal.snapshot_after_mib * 2**20)
        due_at = max(journal.covered_bytes, self._journal_tried_at) + limit
        if journal.bytes_appended >= due_at:
            return True
        journal.set_growth_alarm(due_at, self._wake.set)
        return False

    @property
    def interval_s(self) -> float:
        """The periodic snapshots' interval now (:func:`interval_for`)."""
        return self._schedule.interval_s

    def _interval_s(self) -> float:
        journal = self._parts.seal_journal
        return interval_for(
            self._settings.interval_s,
            journal_keeps_seals=journal is not None and journal.failure is None,
        )

    def stop(self) -> None:
        """Make :meth:`run_periodic` return after its current snapshot, if any."""
        self._stopping = True
        self._wake.set()

    async def snapshot_if_changed(self) -> Path | None:
        """Write one rollout snapshot unless nothing mutated since the last one.

        Returns the committed snapshot, or None when skipped or failed. A
        failed write leaves the previous snapshot as it was and is logged;
        the next call tries again. The ``max_consecutive_failures``-th
        failure in a row raises :class:`SnapshotsFailingError`.
        """
        async with self._lock:
            if self._last_version == self._parts.cut.mutation_version:
                self.stats.skipped += 1
                return None
            capture = await self._capture(base_step=None)
            started = time.perf_counter()
            root = snapshots_root(self.anchor()) / SEGMENTS_DIRNAME
            segments = self._rows.for_segments(root)
            ledger = self._ledger.for_segments(root)
            facts = self._facts.for_segments(root)
            try:
                path = await asyncio.to_thread(
                    publish_snapshot,
                    self.anchor(),
                    manifest=capture.manifest,
                    write_payload=functools.partial(
                        self._write_payload, capture, segments, ledger, facts
                    ),
                    keep_latest_k=self._settings.keep_latest_k,
                )
            except SnapshotWriteError as error:
                self._last_version = None  # nothing of it is on disk: the next try must write
                self._snapshot_failed(error)
                return None
            if segments.last_written is not None:
                segments.committed(segments.last_written)
            if ledger.last_written is not None:
                ledger.committed(ledger.last_written)
            if facts.last_written is not None:
                facts.committed(facts.last_written)
            await asyncio.to_thread(self._collect_segments, path.parent, segments, ledger, facts)
            self._schedule.succeeded()
            self.stats.write_seconds.append(time.perf_counter() - started)
            self.stats.snapshots += 1
            self._committed_journal_seq = capture.controller.dispatch_journal_seq
            await self._rotate_seal_journal(capture.controller.seal_journal_seq)
            return path

    def _snapshot_failed(self, error: SnapshotWriteError) -> None:
        self.stats.failures += 1
        limit = self._schedule.max_consecutive_failures
        newest = self.newest_good_state()
        if self._schedule.failed():
            raise SnapshotsFailingError(
                f"{limit} rollout snapshot(s) in a row failed "
                f"(rollout_checkpointing.max_consecutive_failures={limit}); the last: {error}. "
                f"The newest good snapshot is {newest}: a restart resumes from it once the "
                "disk has room."
            ) from error
        _LOG.warning(
            "rollout snapshot failed (%d in a row; the run stops at %d): %s; the newest good "
            "snapshot is %s; trying again in %.3g s",
            self._schedule.consecutive,
            limit,
            error,
            newest,
            self._schedule.next_wait_s(),
        )

    def newest_good_state(self) -> str:
        """The newest committed snapshot a restart would resume from, for messages."""
        anchor = self.anchor()
        committed = committed_snapshot_paths(snapshots_root(anchor))
        if committed:
            return str(committed[-1])
        if self._parts.base_step > 0:
            return f"{anchor / TRAINER_ROLLOUT_STATE_DIRNAME} (of trainer checkpoint {anchor.name})"
        return "none yet (a restart starts the run from the beginning)"

    def due_for_trainer_checkpoint(self) -> bool:
        """Whether the current trainer version ends a ``save_period``."""
        version = self._parts.trainer_version
        return version > 0 and version % self._parts.config.checkpointing.save_period == 0

    async def trainer_checkpoint(self) -> Path:
        """Publish ``step_<V>/`` for the current trainer version V, then re-anchor on it.

        Call between optimizer steps (the train pump does). Afterwards the
        groups trained before V are no longer needed for a rollback: their
        rows are cleared, and bootstrap snapshots and older trainer
        checkpoints are pruned.
        """
        parts = self._parts
        async with self._lock:
            version = parts.trainer_version
            capture = await self._capture(base_step=version)
            retired = list(parts.trained_since_checkpoint)
            keys = [
                train_key(e.group_id, i)
                for e in retired
                for i in range(capture.generations_per_group)
            ]
            capture = dataclasses.replace(
                capture, data_plane=capture.data_plane.without(TRAIN_PARTITION, keys)
            )
            try:
                path = await asyncio.to_thread(
                    publish_trainer_checkpoint,
                    self._checkpoint_dir,
                    version,
                    functools.partial(self._write_trainer_checkpoint, capture),
                )
            except SnapshotWriteError as error:
                raise TrainerCheckpointWriteError(
                    f"the trainer checkpoint of step {version} could not be written: {error}. "
                    f"The newest good state is {self.newest_good_state()}: a restart resumes "
                    "from it once the disk has room."
                ) from error
            async with parts.cut.mutation():
                await parts.data_plane.clear(TRAIN_PARTITION, keys)
                for entry in retired:
                    parts.forget_group(entry.group_id)
                del parts.trained_since_checkpoint[: len(retired)]
                parts.base_step = version
            await asyncio.to_thread(self._prune, path)
            self._committed_journal_seq = capture.controller.dispatch_journal_seq
            self._prune_journal()
            await self._rotate_seal_journal(capture.controller.seal_journal_seq)
            self._schedule.committed_elsewhere()
            self.stats.trainer_checkpoints += 1
            return path

    async def _capture(self, *, base_step: int | None) -> RolloutStateCapture:
        parts = self._parts
        async with parts.cut.checkpoint():
            # A log line that could not be written means the state is ahead of
            # the evidence: such a state must never be committed.
            failure = parts.logs.failure()
            if failure is None and parts.journal is not None:
                failure = parts.journal.failure
            if failure is not None:
                raise failure
            started = time.perf_counter()
            cut = take_cut_capture(parts, base_step=base_step)
            self.stats.cut_hold_seconds.append(time.perf_counter() - started)
        self._last_version = cut.mutation_version
        # Building the sidecar checks the controller's per-group maps and names
        # every group's origin: milliseconds of Python that would stall dispatch
        # and sealing on the event loop (the ledger's records are encoded later,
        # only those that changed). The capture is immutable (copy-on-write
        # ledger, copied maps), so a thread may build it.
        return await asyncio.to_thread(
            build_snapshot,
            cut,
            parts,
            fingerprint=self._fingerprint,
            identities=self._identities,
        )

    def _write_payload(
        self,
        capture: RolloutStateCapture,
        segments: SegmentedWriter | None,
        ledger: LedgerSegmentWriter | None,
        facts: FactSegmentWriter | None,
        directory: Path,
    ) -> None:
        self.stats.bytes_written += write_snapshot_payload(
            capture, directory, segments=segments, ledger=ledger, facts=facts
        )

    @staticmethod
    def _collect_segments(
        root: Path, segments: SegmentedWriter, ledger: LedgerSegmentWriter, facts: FactSegmentWriter
    ) -> None:
        keep = segments.base_segments() | ledger.base_segments() | facts.base_segments()
        try:
            collect_segments(root, also_keep=keep)
        except OSError as exc:
            # The snapshot stands; what was not deleted is deleted by the next collection.
            _LOG.warning(
                "committed a snapshot in %s, but deleting old segments failed: %s", root, exc
            )

    def _write_trainer_checkpoint(self, capture: RolloutStateCapture, directory: Path) -> None:
        trainer_dir = directory / TRAINER_STATE_DIRNAME
        trainer_dir.mkdir()
        self._trainer.save_checkpoint(trainer_dir)
        rollout_dir = directory / TRAINER_ROLLOUT_STATE_DIRNAME
        rollout_dir.mkdir()
        self._write_payload(capture, None, None, None, rollout_dir)
        write_snapshot_manifest(rollout_dir, capture.manifest)

    def _prune_journal(self) -> None:
        """Drop the dispatch journal segments the last committed snapshot reflects.

        Not after the final snapshot of a run: attempts it holds dispatched
        were cancelled by the stop, and only the journal says so.
        """
        if self._parts.journal is not None:
            self._parts.journal.prune(self._committed_journal_seq)

    async def _rotate_seal_journal(self, covered_seq: int) -> None:
        """A committed snapshot reflects the seal journal below ``covered_seq``: rotate, drop.

        A failure here loses nothing (the segments stay, and replaying what a
        snapshot already holds is a no-op): logged, and the next snapshot tries again.
        """
        journal = self._parts.seal_journal
        if journal is None:
            return
        journal.covering(covered_seq)
        # Partials are not in the snapshot: those of live attempts go past the rotation.
        journal.carry_partials(carry_live_partials(self._parts.partials, self._parts.ledger))
        try:
            await asyncio.to_thread(journal.covered, covered_seq)
        except OSError as exc:
            _LOG.warning("seal journal: rotating after a snapshot failed: %s", exc)

    def _prune(self, latest: Path) -> None:
        try:
            prune_bootstrap_snapshots(self._checkpoint_dir, durable_trainer_checkpoint=latest)
            prune_trainer_checkpoints(
                self._checkpoint_dir, keep_latest=self._parts.config.checkpointing.keep_latest_k
            )
        except OSError as exc:
            # The checkpoint stands; what was not pruned is pruned by the next one.
            _LOG.warning("published %s, but pruning older state failed: %s", latest, exc)
