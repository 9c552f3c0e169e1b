"""The train pump: take the groups of the current step, train, sync weights.

Step S trains once every group the sampler assigned to S is canonical: with
``in_order``, the groups stamped S (all of S's slots handed out, minus the
groups recorded lost from S); with ``windowed``, the oldest
``num_prompts_per_step`` groups within ``max_staleness_versions`` of the
trainer. A windowed group that goes stale when the trainer version moves is
lost from the step it went stale at. After the optimizer step the trainer
version increases and the gate gets the new weight version; new dispatches
wait meanwhile.

On a stop request (:class:`~rollvault.controller.loop.shutdown.Shutdown`) the
pump takes no further step and starts no trainer checkpoint; a step being
trained runs to its end (its thread cannot be interrupted), while the
pipeline writes the final rollout snapshot beside it. That snapshot is
anchored to the last trainer checkpoint and keeps every group trained since,
so a restart trains them again; a trainer checkpoint would only save that
retraining, at the cost of the model and optimizer state's write time, which
the grace period cannot spare.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.data.sampler import InOrderSampler, WindowedSampler
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.gate import Gate
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import DropLogRecord, TrainLogRecord
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.controller.loop.trainer import TrainBatch, Trainer
from rollvault.controller.snapshots.checkpointer import Checkpointer
from rollvault.dataplane.interface import TRAIN_PARTITION, train_key


class TrainPump:
    """Trains step after step until the step budget or the data runs out."""

    def __init__(
        self,
        parts: RolloutParts,
        trainer: Trainer,
        gate: Gate,
        *,
        capacity: ReplayCapacity,
        dispatch_open: asyncio.Event,
        on_step: Callable[[RolloutParts, dict[str, float]], None] | None = None,
        checkpointer: Checkpointer | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self._parts = parts
        self._trainer = trainer
        self._gate = gate
        self._capacity = capacity
        self._dispatch_open = dispatch_open
        self._on_step = on_step
        self._checkpointer = checkpointer
        self._shutdown = shutdown
        self.trained_groups = 0

    async def run(self) -> None:
        """Train until the step budget, the data or a stop request ends the run.

        After a stop request, call :meth:`~rollvault.controller.loop.parts.RolloutParts.notify`
        so that a pump waiting for its next batch sees it.
        """
        parts = self._parts
        while parts.trainer_version < parts.config.grpo.max_num_steps:
            async with parts.changed:
                await parts.changed.wait_for(
                    lambda: self._stopping() or self._batch_ready() is not None
                )
            if self._stopping():
                return
            if not self._batch_ready():
                break  # no step is left: the data ran out
            metrics = await self._train()
            await self._sync_weights()
            checkpointer = self._checkpointer
            if checkpointer and not self._stopping() and checkpointer.due_for_trainer_checkpoint():
                await checkpointer.trainer_checkpoint()
            if self._on_step is not None:
                self._on_step(parts, metrics)
        if not self._stopping():
            await self._final_trainer_checkpoint()

    def _stopping(self) -> bool:
        return self._shutdown is not None and self._shutdown.requested

    async def _final_trainer_checkpoint(self) -> None:
        """Make the last step durable, whatever ``save_period`` is.

        Otherwise a run of 60 steps with ``save_period=50`` would keep only
        ``step_50`` and a later extension of it would train steps 50-59 again.
        """
        parts = self._parts
        if self._checkpointer is not None and parts.trainer_version > parts.base_step:
            await self._checkpointer.trainer_checkpoint()

    # -- readiness (pure: called under the condition's lock) ------------------------------

    def _batch_ready(self) -> bool | None:
        """True: a batch can be taken; False: no step is left; None: wait."""
        sampler = self._parts.sampler
        if isinstance(sampler, InOrderSampler):
            return self._in_order_ready(sampler)
        return self._windowed_ready()

    def _in_order_ready(self, sampler: InOrderSampler) -> bool | None:
        parts = self._parts
        step = parts.trainer_version
        per_step = parts.config.grpo.num_prompts_per_step
        stamped = min(max(sampler.next_stamp_index - step * per_step, 0), per_step)
        if stamped < per_step and not parts.reservation_finished:
            return None
        if stamped == 0:
            return False
        expected = stamped - parts.shortfall.lost(step)
        return True if parts.replay.count_for_step(step) >= expected else None

    def _windowed_ready(self) -> bool | None:
        parts = self._parts
        available = len(parts.replay)
        if available >= parts.config.grpo.num_prompts_per_step:
            return True
        if parts.reservation_finished and len(parts.ledger) == 0:
            return available > 0
        return None

    # -- one step -----------------------------------------------------------------------

    async def _train(self) -> dict[str, float]:
        parts = self._parts
        per_group = parts.config.grpo.num_generations_per_prompt
        step = parts.trainer_version
        # The batch stays in the replay index while it trains: a snapshot taken
        # meanwhile must still hold it (the trainer awaits, snapshots go on).
        entries = self._peek_batch()
        keys = [train_key(e.group_id, i) for e in entries for i in range(per_group)]
        rows = await parts.data_plane.get(TRAIN_PARTITION, keys)
        metrics: dict[str, float] = {}
        if entries:
            batch = TrainBatch(
                step=step, groups=entries, rows=rows, generations_per_group=per_group
            )
            metrics = await self._trainer.train_step(batch)
        # No attempt may start between the version bump and the gate's weight
        # sync: it would generate with the old weights under the new version.
        self._dispatch_open.clear()
        async with parts.cut.mutation():
            for entry in entries:
                parts.replay.remove(entry.group_id)
                self._log_trained(step, entry)
            # Rows stay until the next trainer checkpoint: a restore to the last
            # one trains these groups again, in the same steps.
            parts.trained_since_checkpoint.extend(entries)
            parts.trainer_version += 1
            released = len(entries) + await self._drop_stale()
        for _ in range(released):
            self._capacity.release()
        self.trained_groups += len(entries)
        if parts.seal_journal is not None:
            parts.seal_journal.step(parts.trainer_version, [e.group_id for e in entries])
            metrics = {**metrics, **parts.seal_journal.metrics()}
            # Token-prefix resume: journaled prefix tokens this start continued after.
            metrics["journal/prefix_tokens_resumed"] = float(parts.partials.tokens_resumed)
        return metrics

    def _peek_batch(self) -> list[ReplayEntry]:
        parts = self._parts
        sampler = parts.sampler
        if isinstance(sampler, InOrderSampler):
            return parts.replay.step_entries(parts.trainer_version)
        assert isinstance(sampler, WindowedSampler)
        return parts.replay.window_entries(
            parts.trainer_version,
            sampler.max_staleness_versions,
            parts.config.grpo.num_prompts_per_step,
        )

    async def _drop_stale(self) -> int:
        """Windowed only: groups too old for the new trainer version are lost."""
        parts = self._parts
        sampler = parts.sampler
        if not isinstance(sampler, WindowedSampler):
            return 0
        version = parts.trainer_version
        stale = parts.replay.take_stale(version, sampler.max_staleness_versions)
        per_group = parts.config.grpo.num_generations_per_prompt
        for entry in stale:
            keys = [train_key(entry.group_id, i) for i in range(per_group)]
            await parts.data_plane.clear(TRAIN_PARTITION, keys)
            parts.shortfall.record_loss(version)
            parts.forget_group(entry.group_id)
            parts.logs.drops.write(
                DropLogRecord(
                    group_id=entry.group_id,
                    sample_id=entry.sample_id,
                    epoch=entry.epoch,
                    target_step=None,
                    replaced=False,
                    incarnation=parts.logs.incarnation,
                )
            )
        return len(stale)

    def _log_trained(self, step: int, entry: ReplayEntry) -> None:
        parts = self._parts
        finalized = parts.group(entry.group_id).finalization()
        parts.logs.train.write(
            TrainLogRecord(
                step=step,
                trainer_version=step,
                group_id=entry.group_id,
                sample_id=entry.sample_id,
                epoch=entry.epoch,
                rewards=[reward.reward for reward in finalized.rewards],
                gate_rollout_ids=list(finalized.gate_rollout_ids),
                target_step=entry.target_step,
                incarnation=parts.logs.incarnation,
            )
        )

    async def _sync_weights(self) -> None:
        try:
            await self._gate.update_weights(self._parts.trainer_version)
        finally:
            self._dispatch_open.set()
        await self._parts.notify()
