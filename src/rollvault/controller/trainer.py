"""What the train pump asks of a trainer, and a trainer that only records.

The train pump hands the trainer one batch per step: the canonical rows of
every prompt group the sampler assigned to that step. The GRPO trainer
implements this protocol on a real model; :class:`RecordingTrainer` checks
what it receives and keeps a record, which is what the pipeline's tests use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec
import numpy as np

from rollvault.controller.replay_index import ReplayEntry
from rollvault.dataplane.interface import train_key
from rollvault.dataplane.rows import RowView


class TrainBatch(msgspec.Struct, frozen=True, kw_only=True):
    """The groups of one optimizer step and their canonical rows."""

    step: int
    groups: list[ReplayEntry]
    rows: Mapping[str, RowView]
    """Canonical rows by train key (``{group_id}_g{i}``), N per group."""
    generations_per_group: int


class Trainer(Protocol):
    """Applies one optimizer step per batch."""

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Train on ``batch``; return scalar metrics (loss, ...)."""
        ...


class TrainBatchError(ValueError):
    """A batch is not what the train pump promised."""


class RecordingTrainer:
    """Checks every batch and records which groups each step trained.

    It verifies what any trainer relies on: N rows per group, aligned arrays,
    finite advantages, and a masked row contributing no tokens.
    """

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[str]]] = []

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        tokens = 0
        for entry in batch.groups:
            for index in range(batch.generations_per_group):
                key = train_key(entry.group_id, index)
                row = batch.rows.get(key)
                if row is None:
                    raise TrainBatchError(f"step {batch.step}: batch lacks canonical row {key!r}")
                tokens += _check_row(batch.step, key, row)
        self.steps.append((batch.step, [entry.group_id for entry in batch.groups]))
        return {"tokens": float(tokens), "groups": float(len(batch.groups))}


def _check_row(step: int, key: str, row: RowView) -> int:
    ids = np.asarray(row["input_ids"])
    mask = np.asarray(row["token_mask"])
    advantages = np.asarray(row["advantages"])
    if not (len(ids) == len(mask) == len(advantages)):
        raise TrainBatchError(f"step {step}: row {key!r} has misaligned arrays")
    if not np.isfinite(advantages).all():
        raise TrainBatchError(f"step {step}: row {key!r} has non-finite advantages")
    if bool(row["sample_mask"]) is False and mask.any():
        raise TrainBatchError(f"step {step}: masked row {key!r} still has trainable tokens")
    return int(mask.sum())
