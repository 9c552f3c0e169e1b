"""What a run ending by its step budget leaves untrained, logged so it is not taken as lost.

When the train pump stops at ``grpo.max_num_steps`` the rollout pump has
usually reserved ahead: spares in the replacement reserve, groups in flight,
finalized groups in the replay index; and the dataloader's current epoch may
have prompts not drawn yet. Each gets a ``pending.jsonl`` line, so every prompt
of every epoch the run reached is trained, dropped or pending. The lines are
written after the start's final snapshot: a later start that restores any
snapshot of this one rolls them back (their ``seq`` is past its
``restored_seq``) and trains those prompts itself.
"""

from __future__ import annotations

from collections import Counter

from rollvault.controller.loop.parts import GroupStage, RolloutParts
from rollvault.controller.loop.run_logs import PendingLogRecord, PendingReason

__all__ = ["pending_prompts", "record_pending"]


def pending_prompts(parts: RolloutParts) -> list[PendingLogRecord]:
    """Every prompt of a reached epoch that is neither trained nor dropped, in a stable order."""
    incarnation = parts.logs.incarnation
    version = parts.trainer_version

    def line(
        epoch: int, dataset_idx: int, reason: PendingReason, group_id: str | None
    ) -> PendingLogRecord:
        return PendingLogRecord(
            epoch=epoch,
            sample_id=str(dataset_idx),
            reason=reason,
            group_id=group_id,
            trainer_version=version,
            incarnation=incarnation,
        )

    records = []
    for entry in parts.groups.values():
        if entry.stage is GroupStage.PENDING:
            reason = PendingReason.IN_FLIGHT
        elif entry.group_id in parts.replay:
            reason = PendingReason.BUFFERED
        else:
            continue  # trained since the last trainer checkpoint
        records.append(line(entry.origin.epoch, entry.origin.dataset_idx, reason, entry.group_id))
    records += [line(e, i, PendingReason.SPARE, None) for e, i in parts.spares]
    if not parts.dataloader.exhausted(parts.config.grpo.max_num_epochs):
        undrawn = parts.dataloader.undrawn_in_epoch()
        records += [line(e, i, PendingReason.NOT_DRAWN, None) for e, i in undrawn]
    return records


def record_pending(parts: RolloutParts) -> dict[str, int]:
    """Log :func:`pending_prompts`; returns how many per reason."""
    records = pending_prompts(parts)
    parts.logs.pending.write_many(records)  # one write: an epoch's undrawn prompts are thousands
    return dict(Counter(record.reason.value for record in records))
