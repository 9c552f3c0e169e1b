"""The controller's shared parts: everything the pumps mutate and a snapshot captures.

One instance per run, created on the controller's event loop. Every mutation
of these parts happens inside a mutation section of ``cut``; the pumps wait
on ``changed`` (notified after each mutation that can unblock someone) rather
than polling.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from rollvault.config.schema import RunConfig
from rollvault.controller.data.dataloader import PromptDataLoader
from rollvault.controller.data.replay_index import ReplayBufferIndex, ReplayEntry
from rollvault.controller.data.sampler import Sampler
from rollvault.controller.data.shortfall import BatchShortfall, SparePrompts
from rollvault.controller.loop.dispatch_journal import DispatchJournal, LostGroupInterruption
from rollvault.controller.loop.episodes import EpisodeTable
from rollvault.controller.loop.io_failures import LogWriteError
from rollvault.controller.loop.partials import PartialPrefixes
from rollvault.controller.loop.run_logs import (
    AttemptLogRecord,
    DropLogRecord,
    JsonlWriter,
    LogSequence,
    PendingLogRecord,
    RestoreLogRecord,
    TrainLogRecord,
    TurnLogRecord,
)
from rollvault.controller.loop.seal_journal import SealJournal, SealRecord
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.interface import DataPlane
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.reward_penalties import FinalizedReward
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.protocols import PromptDataset


class GroupOrigin(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where a prompt group's prompt came from in the dataloader's order."""

    epoch: int
    dataset_idx: int


class GroupStage(enum.StrEnum):
    """How far a group in :attr:`RolloutParts.groups` has come."""

    PENDING = "pending"
    """Reserved and in the ledger, not finalized yet."""
    FINALIZED = "finalized"
    """Canonical: waiting in the replay index, or trained since the last trainer checkpoint."""


class GroupStateError(RuntimeError):
    """A group transition that its current stage does not allow (a controller bug)."""


class FinalizedGroup(msgspec.Struct, frozen=True, kw_only=True):
    """What the finalizer recorded about a canonical group, for training logs and snapshots.

    Immutable all the way down (tuples of frozen Structs, numbers and
    strings), like the ledger's capture: a snapshot's capture holds references
    to these, taken inside the cut and encoded after it, so nothing may change
    them in between. Build one with :meth:`of`.
    """

    rewards: tuple[FinalizedReward, ...]
    """Per sibling, its reward after the checks and penalties."""
    metrics: tuple[tuple[str, float], ...]
    """The finalizer metrics as (name, value) pairs sorted by name; :meth:`metrics_dict` for a dict."""
    gate_rollout_ids: tuple[str, ...]
    """Per sibling, the gate rollout id of its published attempt."""

    @classmethod
    def of(
        cls,
        *,
        rewards: Iterable[FinalizedReward],
        metrics: Mapping[str, float],
        gate_rollout_ids: Iterable[str],
    ) -> FinalizedGroup:
        """Copy what the finalizer (or a restored snapshot) holds into the frozen form."""
        return cls(
            rewards=tuple(rewards),
            # Sorted by name: the sidecar's JSON sorts keys, so a restored group compares equal.
            metrics=tuple(sorted((name, float(value)) for name, value in metrics.items())),
            gate_rollout_ids=tuple(gate_rollout_ids),
        )

    def metrics_dict(self) -> dict[str, float]:
        """The metrics as a fresh dict (the caller may change it)."""
        return dict(self.metrics)


class GroupEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One group the controller still answers for: where its prompt came from and,
    once finalized, what the finalizer recorded. Replaced, never changed in place."""

    group_id: str
    origin: GroupOrigin
    finalized: FinalizedGroup | None = None

    @property
    def stage(self) -> GroupStage:
        return GroupStage.PENDING if self.finalized is None else GroupStage.FINALIZED

    def finalization(self) -> FinalizedGroup:
        """The finalized part; raises :class:`GroupStateError` while the group is pending."""
        if self.finalized is None:
            raise GroupStateError(
                f"group {self.group_id!r} is {self.stage.value}: it has no finalization"
            )
        return self.finalized


@dataclass
class RunLogs:
    """The run's append-only evidence (see :mod:`rollvault.controller.loop.run_logs`)."""

    train: JsonlWriter[TrainLogRecord]
    attempts: JsonlWriter[AttemptLogRecord]
    drops: JsonlWriter[DropLogRecord]
    restores: JsonlWriter[RestoreLogRecord]
    pending: JsonlWriter[PendingLogRecord]
    """Prompts left untrained when the run ends by the step budget."""
    turns: JsonlWriter[TurnLogRecord]
    """Committed turns of attempts (multi-turn evidence)."""
    sequence: LogSequence
    incarnation: int

    def log_discarded_seal(
        self, record: PromptGroupRecoveryRecord, generation_index: int, reason: str
    ) -> None:
        """Log a sealed sibling whose work was thrown away (``prompt_group`` redo, drop)."""
        attempt = record.siblings[generation_index].current_attempt
        context = attempt.reward_log_context
        self.attempts.write(
            AttemptLogRecord(
                gate_rollout_id=record.gate_rollout_id(generation_index),
                group_id=record.group_id,
                generation_index=generation_index,
                status=RolloutAttemptStatus.ABANDONED,
                num_tokens=context.response_length if context is not None else 0,
                incarnation=self.incarnation,
                reason=reason,
            )
        )

    def failure(self) -> LogWriteError | None:
        """Why a log refuses lines, if one does: the state may then be ahead of the logs."""
        for writer in (
            self.train,
            self.attempts,
            self.drops,
            self.restores,
            self.pending,
            self.turns,
        ):
            if writer.failure is not None:
                return writer.failure
        return None

    def close(self) -> None:
        self.train.close()
        self.attempts.close()
        self.drops.close()
        self.restores.close()
        self.pending.close()
        self.turns.close()


@dataclass
class RolloutParts:
    """State shared by the rollout pump, the finalizer, the train pump and snapshots."""

    config: RunConfig
    cut: DataPlaneMutationCut
    ledger: RolloutRecoveryLedger
    data_plane: DataPlane
    dataset: PromptDataset
    dataloader: PromptDataLoader
    sampler: Sampler
    replay: ReplayBufferIndex
    shortfall: BatchShortfall
    spares: SparePrompts
    logs: RunLogs
    trainer_version: int = 0
    groups: dict[str, GroupEntry] = field(default_factory=dict)
    """Every group in the ledger, the replay index or ``trained_since_checkpoint``,
    by group id. Change it only through the methods below, which keep its rules."""
    base_step: int = 0
    """Trainer version of the last durable trainer checkpoint (0: the bootstrap anchor)."""
    trained_since_checkpoint: list[ReplayEntry] = field(default_factory=list)
    """Groups trained after ``base_step``, in training order. Their rows, rewards
    and attempt ids are kept until the next trainer checkpoint, so that a
    restore to ``base_step`` can train them again in the same steps."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    reservation_finished: bool = False
    """No more prompts will be reserved (data exhausted or step budget stamped)."""
    journal: DispatchJournal | None = None
    """The dispatch journal (None: rollout checkpointing is off, nothing is restored)."""
    lost_interruptions: list[LostGroupInterruption] = field(default_factory=list)
    """Interrupted attempts of groups a restore lost, until their prompts are reserved again."""
    episodes: EpisodeTable = field(default_factory=EpisodeTable)
    """In-flight episodes' environment state at their last committed turn."""
    seal_journal: SealJournal | None = None
    """The seal journal (None: off, or rollout checkpointing is off)."""
    journaled_seals: dict[tuple[int, int], dict[int, SealRecord]] = field(default_factory=dict)
    """Seals a restore read from the journal for groups it lost, by (epoch, dataset
    index) and generation index, until the prompt is reserved again."""
    partials: PartialPrefixes = field(default_factory=PartialPrefixes)
    """Token-prefix resume: partial outputs of turns in flight (``rollout.prefix_resume``)."""

    async def notify(self) -> None:
        """Wake every task waiting on ``changed``."""
        async with self.changed:
            self.changed.notify_all()

    # -- the group table ------------------------------------------------------------

    def group(self, group_id: str) -> GroupEntry:
        """The entry of a group; raises :class:`GroupStateError` for an unknown one."""
        return group_entry(self.groups, group_id)

    def add_reserved_group(self, group_id: str, origin: GroupOrigin) -> None:
        """Enter a group just reserved in the ledger, as pending."""
        entry = self.groups.get(group_id)
        if entry is not None:
            raise GroupStateError(
                f"group {group_id!r} cannot be reserved: it is already {entry.stage.value}"
            )
        self.groups[group_id] = GroupEntry(group_id=group_id, origin=origin)

    def record_finalization(self, group_id: str, finalized: FinalizedGroup) -> None:
        """Mark a pending group finalized with what the finalizer recorded."""
        entry = self.groups.get(group_id)
        if entry is None:
            raise GroupStateError(f"group {group_id!r} cannot be finalized: it is {_UNKNOWN}")
        if entry.finalized is not None:
            raise GroupStateError(
                f"group {group_id!r} cannot be finalized: it is already finalized"
            )
        self.groups[group_id] = GroupEntry(
            group_id=group_id, origin=entry.origin, finalized=finalized
        )

    def forget_group(self, group_id: str) -> GroupEntry:
        """Remove a group the controller no longer answers for (dropped, or trained
        before the last trainer checkpoint); returns its entry."""
        entry = self.groups.pop(group_id, None)
        if entry is None:
            raise GroupStateError(f"group {group_id!r} cannot be forgotten: it is {_UNKNOWN}")
        return entry

    def load_groups(
        self,
        origins: Mapping[str, GroupOrigin],
        *,
        rewards: Mapping[str, Sequence[FinalizedReward]],
        metrics: Mapping[str, Mapping[str, float]],
        gate_rollout_ids: Mapping[str, Sequence[str]],
    ) -> None:
        """Enter the groups of a restored snapshot, from the per-group maps it stores.

        A group in ``gate_rollout_ids`` (a canonical one) is entered finalized
        and needs an origin, rewards and metrics; every other origin is
        entered pending. Raises :class:`GroupStateError` naming the first
        group that breaks this, before entering any.
        """
        for group_id in rewards.keys() | metrics.keys():
            if group_id not in gate_rollout_ids:
                raise GroupStateError(
                    f"group {group_id!r} has finalizer rewards or metrics but no canonical "
                    "attempt ids"
                )
        for group_id in origins:
            if group_id in self.groups:
                raise GroupStateError(
                    f"group {group_id!r} cannot be restored: it is already "
                    f"{self.groups[group_id].stage.value}"
                )
        for group_id in gate_rollout_ids:
            if group_id not in origins:
                raise GroupStateError(f"canonical group {group_id!r} has no origin")
            if group_id not in rewards or group_id not in metrics:
                raise GroupStateError(
                    f"canonical group {group_id!r} lacks its finalizer rewards or metrics"
                )
        for group_id, origin in origins.items():
            self.add_reserved_group(group_id, origin)
        for group_id, attempt_ids in gate_rollout_ids.items():
            finalized = FinalizedGroup.of(
                rewards=rewards[group_id], metrics=metrics[group_id], gate_rollout_ids=attempt_ids
            )
            self.record_finalization(group_id, finalized)


_UNKNOWN = "unknown (never reserved, or already forgotten)"


def group_entry(groups: Mapping[str, GroupEntry], group_id: str) -> GroupEntry:
    """``groups[group_id]``, or :class:`GroupStateError` naming the unknown group."""
    entry = groups.get(group_id)
    if entry is None:
        raise GroupStateError(f"group {group_id!r} is {_UNKNOWN}")
    return entry
