"""Accuracy from the environment's ``correct``: staged, digested, stored, counted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rollvault.controller.loop.gate import staged_row_digest
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.dataplane.rows import Row, RowView
from rollvault.training.grpo_trainer import _reward_metrics


def _row(reward: float, *, masked: bool = False, correct: bool | None = None) -> Row:
    row: Row = {
        "input_ids": np.arange(4, dtype=np.int64),
        "token_mask": np.array([0, 0, 1, 1], dtype=np.int8),
        "reward": reward,
        "sample_mask": not masked,
    }
    if correct is not None:
        row["correct"] = correct
    return row


def test_accuracy_is_the_mean_verdict_of_unmasked_rows_that_have_one() -> None:
    rows: list[RowView] = [
        _row(1.1, correct=True),
        _row(0.1, correct=False),
        _row(0.1, correct=False),
        _row(5.0, correct=True, masked=True),  # masked: neither reward nor accuracy
        _row(0.7),  # no verdict: in the reward mean, out of the accuracy
    ]
    metrics = _reward_metrics(rows)
    assert metrics["accuracy"] == pytest.approx(1 / 3)
    assert metrics["reward_mean"] == pytest.approx((1.1 + 0.1 + 0.1 + 0.7) / 4)
    assert metrics["samples"] == 5


def test_a_high_reward_without_a_verdict_is_not_accuracy() -> None:
    # Rewards alone never count as correct: a batch without verdicts has no accuracy.
    metrics = _reward_metrics([_row(1.0), _row(2.0)])
    assert "accuracy" not in metrics and metrics["reward_mean"] == pytest.approx(1.5)
    assert _reward_metrics([_row(0.0, correct=True), _row(0.0, correct=True)])["accuracy"] == 1.0


def test_a_bool_verdict_is_stored_and_digested_like_the_gate_staged_it() -> None:
    row = _row(1.0, correct=True)
    digest = staged_row_digest(row)

    async def stored() -> RowView:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        await data_plane.put(STAGING_PARTITION, {"k": row})
        return (await data_plane.get(STAGING_PARTITION, ["k"]))["k"]

    back = asyncio.run(stored())
    assert back["correct"] is True and staged_row_digest(back) == digest
    assert staged_row_digest(_row(1.0, correct=False)) != digest
    assert staged_row_digest(_row(1.0)) != digest
