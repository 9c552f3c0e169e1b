"""A trainer that checks and records what it is given, and trains nothing.

The pipeline's tests and the simulated run use it: it verifies what any
trainer relies on (N rows per group, aligned arrays, finite advantages, a
masked row contributing no tokens), and its checkpointed state is the record
itself, so a restore to a trainer checkpoint forgets the steps trained after
it, as a real model's weights would.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from rollvault.controller.loop.trainer import TrainBatch, TrainBatchError, TrainerCheckpointError
from rollvault.dataplane.interface import train_key
from rollvault.dataplane.rows import RowView


class RecordedStep(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One step a :class:`RecordingTrainer` trained: which groups."""

    step: int
    group_ids: list[str]


class RecordingTrainerState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a :class:`RecordingTrainer` checkpoint holds."""

    schema_version: int
    steps: list[RecordedStep]


RECORDING_TRAINER_FILENAME = "recording_trainer.json"


class RecordingTrainer:
    """Checks every batch and records which groups each step trained.

    It verifies what any trainer relies on: N rows per group, aligned arrays,
    finite advantages, and a masked row contributing no tokens. Its "state" is
    the record itself, so a restore to a trainer checkpoint forgets the steps
    trained after it, as a real model's weights would.
    """

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[str]]] = []

    def save_checkpoint(self, directory: Path) -> None:
        state = RecordingTrainerState(
            schema_version=1,
            steps=[RecordedStep(step, list(groups)) for step, groups in self.steps],
        )
        (directory / RECORDING_TRAINER_FILENAME).write_bytes(msgspec.json.encode(state))

    def load_checkpoint(self, directory: Path) -> None:
        path = directory / RECORDING_TRAINER_FILENAME
        try:
            state = msgspec.json.decode(path.read_bytes(), type=RecordingTrainerState)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TrainerCheckpointError(f"cannot load trainer checkpoint {path}: {exc}") from exc
        if state.schema_version != 1:
            raise TrainerCheckpointError(
                f"{path}: unsupported schema_version {state.schema_version}"
            )
        self.steps = [(recorded.step, list(recorded.group_ids)) for recorded in state.steps]

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
