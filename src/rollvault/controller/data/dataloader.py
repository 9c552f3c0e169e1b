"""The dataloader cursor: epochs over a map-style dataset, one permutation per epoch.

The cursor is two integers, so a snapshot captures it for free and a restore
resumes at exactly the next prompt. The permutation is a pure function of
``(seed, epoch, len(dataset))``: keys from SHAKE-256, sorted stably, so it
cannot change with a library upgrade between a crash and its restore.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec
import numpy as np

from rollvault.tasks.protocols import PromptDataset

__all__ = ["DataLoaderState", "DataLoaderStateError", "PromptDataLoader", "epoch_permutation"]

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class DataLoaderStateError(ValueError):
    """A dataloader state does not fit this dataset."""


class DataLoaderState(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Cursor: ``position`` prompts of ``epoch`` have been drawn (0 <= position <= len)."""

    epoch: NonNegativeInt
    position: NonNegativeInt


def epoch_permutation(num_items: int, *, seed: int, epoch: int) -> list[int]:
    """The order of dataset indices in ``epoch``; a pure function of its arguments."""
    stream = hashlib.shake_256(f"rollvault/epoch/{seed}/{epoch}".encode())
    keys = np.frombuffer(stream.digest(8 * num_items), dtype="<u8")
    # Stable sort: equal keys (vanishingly rare) keep index order, still deterministic.
    return [int(i) for i in np.argsort(keys, kind="stable")]


class PromptDataLoader:
    """Draws ``(epoch, dataset_idx)`` pairs forever; the caller stops at ``max_epochs``.

    Every index appears exactly once per epoch. An epoch's last draw leaves the
    cursor at ``(epoch, len)``; the next draw moves to ``(epoch + 1, 0)``.
    """

    def __init__(self, dataset: PromptDataset, *, shuffle: bool, seed: int) -> None:
        if len(dataset) < 1:
            raise ValueError("PromptDataLoader needs a dataset with at least one prompt")
        self._size = len(dataset)
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order: list[int] = []

    @property
    def epoch(self) -> int:
        """Epoch of the most recent draw (0 before any)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Prompts drawn so far in :attr:`epoch`."""
        return self._position

    @property
    def next_epoch(self) -> int:
        """Epoch of the next draw: :attr:`epoch`, or the one after once it is all drawn."""
        return self._epoch + 1 if self._position == self._size else self._epoch

    @property
    def epoch_drawn(self) -> bool:
        """Whether every prompt of :attr:`epoch` has been drawn."""
        return self._position == self._size

    def undrawn_in_epoch(self) -> list[tuple[int, int]]:
        """The prompts of :attr:`epoch` not drawn yet, as ``(epoch, dataset_idx)``, in order."""
        order = self._order_for(self._epoch)
        return [(self._epoch, dataset_idx) for dataset_idx in order[self._position :]]

    def next_index(self) -> tuple[int, int]:
        """Draw the next prompt: ``(epoch, dataset_idx)``, advancing across epochs."""
        if self._position == self._size:
            self._epoch += 1
            self._position = 0
        dataset_idx = self._order_for(self._epoch)[self._position]
        self._position += 1
        return self._epoch, dataset_idx

    def exhausted(self, max_epochs: int) -> bool:
        """Whether the next draw would fall in epoch ``max_epochs`` or later."""
        return self.next_epoch >= max_epochs

    def state_dict(self) -> DataLoaderState:
        """The cursor (immutable, so it never aliases live state)."""
        return DataLoaderState(epoch=self._epoch, position=self._position)

    def load_state_dict(self, state: DataLoaderState) -> None:
        """Resume at ``state``; rejects a cursor beyond this dataset, changing nothing."""
        if state.epoch < 0 or not 0 <= state.position <= self._size:
            raise DataLoaderStateError(
                f"DataLoaderState(epoch={state.epoch}, position={state.position}) does not fit "
                f"a dataset of {self._size} prompts (need epoch >= 0 and 0 <= position <= "
                f"{self._size})"
            )
        self._epoch = state.epoch
        self._position = state.position

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._order_epoch:
            self._order = (
                epoch_permutation(self._size, seed=self._seed, epoch=epoch)
                if self._shuffle
                else list(range(self._size))
            )
            self._order_epoch = epoch
        return self._order
