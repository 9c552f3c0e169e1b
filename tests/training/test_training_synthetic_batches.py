"""Batches built without a run: rows shaped as the finalizer's, groups as the replay index's."""

from __future__ import annotations

import numpy as np

from rollvault.controller.loop.trainer import TrainBatch
from rollvault.training.grpo_trainer import step_samples
from rollvault.training.synthetic_batches import response_row, step_group


def test_a_response_row_trains_only_its_response_tokens() -> None:
    row = response_row([5, 6, 7], [8, 9], [-0.5, -0.25], advantage=1.5, reward=1.0)
    assert row["input_ids"].tolist() == [5, 6, 7, 8, 9]  # type: ignore[union-attr]
    assert row["token_mask"].tolist() == [0, 0, 0, 1, 1]  # type: ignore[union-attr]
    assert row["generation_logprobs"].tolist() == [0, 0, 0, -0.5, -0.25]  # type: ignore[union-attr]
    assert row["advantages"].tolist() == [0, 0, 0, 1.5, 1.5]  # type: ignore[union-attr]
    dtypes = [row[k].dtype for k in ("input_ids", "generation_logprobs", "token_mask")]  # type: ignore[union-attr]
    assert dtypes == [np.int64, np.float32, np.int8]
    assert row["reward"] == 1.0 and row["sample_mask"] is True


def test_a_step_group_is_trained_at_its_step_and_its_rows_are_its_siblings() -> None:
    group = step_group(4, 2)
    assert (group.group_id, group.sample_id, group.target_step) == ("s4p2", "2", 4)
    rows = {
        f"{group.group_id}_g{k}": response_row([1], [2, 3], [-1.0, -1.0], advantage=a, reward=r)
        for k, (a, r) in enumerate([(1.0, 1.0), (-1.0, 0.0)])
    }
    batch = TrainBatch(step=4, groups=[group], rows=rows, generations_per_group=2)
    samples = step_samples(batch)  # the trainer's own reading of the batch accepts it
    assert samples.metrics["groups"] == 1.0
