"""The controller's shared parts: everything the pumps mutate and a snapshot captures.

One instance per run, created on the controller's event loop. Every mutation
of these parts happens inside a mutation section of ``cut``; the pumps wait
on ``changed`` (notified after each mutation that can unblock someone) rather
than polling.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgspec

from rollvault.config.schema import RunConfig
from rollvault.controller.data.dataloader import PromptDataLoader
from rollvault.controller.data.replay_index import ReplayBufferIndex, ReplayEntry
from rollvault.controller.data.sampler import Sampler
from rollvault.controller.data.shortfall import BatchShortfall, SparePrompts
from rollvault.controller.dataset import PromptDataset
from rollvault.controller.loop.dispatch_journal import DispatchJournal, LostGroupInterruption
from rollvault.controller.loop.run_logs import (
    AttemptLogRecord,
    DropLogRecord,
    JsonlWriter,
    LogSequence,
    RestoreLogRecord,
    TrainLogRecord,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.interface import DataPlane
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.reward_penalties import FinalizedReward
from rollvault.ledger.statuses import RolloutAttemptStatus


class GroupOrigin(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where a prompt group's prompt came from in the dataloader's order."""

    epoch: int
    dataset_idx: int


@dataclass
class RunLogs:
    """The run's append-only evidence (see :mod:`rollvault.controller.loop.run_logs`)."""

    train: JsonlWriter[TrainLogRecord]
    attempts: JsonlWriter[AttemptLogRecord]
    drops: JsonlWriter[DropLogRecord]
    restores: JsonlWriter[RestoreLogRecord]
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

    def close(self) -> None:
        self.train.close()
        self.attempts.close()
        self.drops.close()
        self.restores.close()


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
    origins: dict[str, GroupOrigin] = field(default_factory=dict)
    """Every group in the ledger or the replay index, by group id."""
    finalizer_rewards: dict[str, list[FinalizedReward]] = field(default_factory=dict)
    finalizer_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    canonical_attempts: dict[str, list[str]] = field(default_factory=dict)
    """Per canonical group, the gate rollout id of each sibling's published attempt."""
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

    async def notify(self) -> None:
        """Wake every task waiting on ``changed``."""
        async with self.changed:
            self.changed.notify_all()
