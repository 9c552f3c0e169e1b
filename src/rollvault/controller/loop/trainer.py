"""What the train pump asks of a trainer.

The train pump hands the trainer one batch per step: the canonical rows of
every prompt group the sampler assigned to that step. Implementations live in
:mod:`rollvault.training`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.dataplane.rows import RowView


class TrainBatch(msgspec.Struct, frozen=True, kw_only=True):
    """The groups of one optimizer step and their canonical rows."""

    step: int
    groups: list[ReplayEntry]
    rows: Mapping[str, RowView]
    """Canonical rows by train key (``{group_id}_g{i}``), N per group."""
    generations_per_group: int


class Trainer(Protocol):
    """Applies one optimizer step per batch; saves and loads its whole state."""

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Train on ``batch``; return scalar metrics (loss, ...)."""
        ...

    def save_checkpoint(self, directory: Path) -> None:
        """Write the trainer's state (weights, optimizer, RNG) into an empty ``directory``.

        Called between steps from a worker thread; files need no fsync (the
        checkpointer publishes the directory atomically). Safe formats only.
        """
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Replace the trainer's state with what :meth:`save_checkpoint` wrote."""
        ...


class TrainBatchError(ValueError):
    """A batch is not what the train pump promised."""


class TrainerLostError(RuntimeError):
    """The trainer is gone (its Ray actor died): the run stops; a restart resumes it."""


class TrainerCheckpointError(ValueError):
    """A trainer checkpoint is missing, damaged or of an unknown schema."""
