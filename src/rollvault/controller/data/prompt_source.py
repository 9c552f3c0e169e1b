"""Where the next prompt comes from: the dataloader or the replacement reserve.

The reserve (:class:`~rollvault.controller.data.shortfall.SparePrompts`) holds
prompts pulled ahead of the dataloader so that a dropped group can still be
replaced at the very end of the data. Exactly once *per epoch* (DESIGN
invariant 1) needs two rules:

- the reserve is refilled only from the dataloader's current epoch, never
  across an epoch boundary, so every spare belongs to the epoch being drawn;
- a spare of an epoch earlier than the dataloader's next draw goes first, so
  at each epoch's end its unused spares are reserved (and train) before the
  first prompt of the next epoch is drawn.

A reserve restored from a snapshot of an older version may hold spares of an
epoch the dataloader has already left; the second rule drains them at once.
"""

from __future__ import annotations

from rollvault.controller.data.dataloader import PromptDataLoader
from rollvault.controller.data.shortfall import SparePrompts

__all__ = ["next_prompt", "refill_spares"]


def next_prompt(
    dataloader: PromptDataLoader, spares: SparePrompts, *, max_epochs: int
) -> tuple[int, int] | None:
    """Take the next prompt as ``(epoch, dataset_idx)``; None when no prompt is left."""
    next_epoch = None if dataloader.exhausted(max_epochs) else dataloader.next_epoch
    oldest = spares.oldest_epoch()
    if oldest is not None and (next_epoch is None or oldest < next_epoch):
        return spares.pop()
    if next_epoch is not None:
        return dataloader.next_index()
    return None


def refill_spares(
    dataloader: PromptDataLoader, spares: SparePrompts, *, wanted: int, max_epochs: int
) -> None:
    """Pull prompts of the dataloader's current epoch until the reserve holds ``wanted``."""
    for _ in range(spares.refill_count(wanted)):
        if dataloader.epoch_drawn or dataloader.exhausted(max_epochs):
            return
        spares.push(*dataloader.next_index())
