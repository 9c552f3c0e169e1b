"""A group's prompt run once for its siblings gives each sequence's own logprobs and gradient."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch

import rollvault.training.grpo_trainer as grpo_trainer
from rollvault.gates.sampling import left_pad
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.logprobs import token_logprobs
from rollvault.training.shared_prefix import (
    right_pad_suffixes,
    shared_prefix_batch,
    suffix_logprobs,
)

# Prompts of different lengths, so both the prefixes and the suffixes are padded.
PROMPTS = ["07+35=", "61+9=", "9+9=", "99+99="]
TOLERANCE = 1e-5


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.9, 0.8, 5)]
)
def test_suffix_logprobs_equal_each_sequence_alone(
    tmp_path: Path, temperature: float, top_p: float, top_k: int
) -> None:
    model, tokenizer = build_model(tmp_path / "model")
    batch = sampled_batch(
        model, tokenizer, step=0, prompts=PROMPTS, generations=4, temperature=temperature
    )
    rows = list(batch.rows.values())
    ids = [np.asarray(row["input_ids"]) for row in rows]
    masks = [np.asarray(row["token_mask"]) for row in rows]
    starts = [int(np.argmax(mask > 0)) for mask in masks]
    pad = int(tokenizer.pad_token_id)
    shared = shared_prefix_batch(ids, starts, pad)
    assert shared is not None
    assert shared.prefixes.input_ids.shape[0] == len(PROMPTS)  # one pass per prompt
    with torch.no_grad():
        got = suffix_logprobs(model, shared, temperature=temperature, top_p=top_p, top_k=top_k)
        assert got is not None
        for row, sequence in enumerate(ids):
            padded = left_pad([sequence.tolist()], pad)
            alone = token_logprobs(
                model, padded, temperature=temperature, top_p=top_p, top_k=top_k
            )[0]
            tail = alone[starts[row] :]
            assert torch.allclose(got[row, : len(tail)], tail, atol=TOLERANCE), row
            assert not got[row, len(tail) :].any()  # padding gets 0
    mask = right_pad_suffixes(masks, shared)
    assert mask.sum() == sum(int(m.sum()) for m in masks)  # no trainable token left out


def test_no_shared_prefix_or_a_trained_first_token_takes_the_row_path() -> None:
    distinct = [np.array([1, 2, 3, 4]), np.array([1, 5, 3, 4])]
    assert shared_prefix_batch(distinct, [2, 2], 0) is None
    same = [np.array([1, 2, 3]), np.array([1, 2, 4])]
    assert shared_prefix_batch(same, [2, 2], 0) is not None
    assert shared_prefix_batch(same, [0, 0], 0) is None
    assert shared_prefix_batch(same, [3, 2], 0) is None  # a sequence without a suffix


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_a_step_with_shared_prompts_equals_the_row_by_row_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kl_coef: float
) -> None:
    def trainer() -> GrpoTrainer:
        model, tokenizer = build_model(tmp_path / "model")
        settings = GrpoSettings(learning_rate=1e-2, kl_coef=kl_coef, temperature=0.7)
        made = GrpoTrainer(model, pad_token_id=int(tokenizer.pad_token_id), settings=settings)
        # Compare the gradients the step leaves, not AdamW's update: AdamW divides by
        # the gradient's own scale, so a rounding-sized gradient (1e-10 against 1e-11)
        # becomes an update of the full learning rate either way.
        monkeypatch.setattr(made._optimizer, "step", lambda: None)
        return made

    shared, rows = trainer(), trainer()
    _, tokenizer = build_model(tmp_path / "model")
    batch = sampled_batch(
        shared.model, tokenizer, step=0, prompts=PROMPTS, generations=4, temperature=0.7
    )
    got = asyncio.run(shared.train_step(batch))
    with monkeypatch.context() as patch:
        patch.setattr(grpo_trainer, "shared_prefix_batch", lambda *_: None)
        expected = asyncio.run(rows.train_step(batch))
    assert got.keys() == expected.keys()
    for key in got:
        assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=TOLERANCE), key
    assert got["grad_norm"] > 0
    if kl_coef:
        assert got["kl"] == 0.0  # the reference is the policy itself before any update
    for (name, a), b in zip(shared.model.named_parameters(), rows.model.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
