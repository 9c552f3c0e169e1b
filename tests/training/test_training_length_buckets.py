"""A step's responses in two passes by length train as in one pass; zero-advantage rows skip."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch

import rollvault.training.grpo_trainer as grpo_trainer
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer

PROMPTS = ["07+35=", "61+9=", "99+99=", "5+5="]


def _sample(prompt: int, response: int) -> grpo_trainer._Sample:
    return grpo_trainer._Sample(
        input_ids=np.arange(prompt + response, dtype=np.int64),
        generation_logprobs=np.zeros(prompt + response, dtype=np.float32),
        token_mask=np.asarray([0] * prompt + [1] * response, dtype=np.float32),
        advantages=np.ones(prompt + response, dtype=np.float32),
    )


def test_a_few_long_responses_get_a_pass_of_their_own() -> None:
    samples = [_sample(7, 3) for _ in range(100)] + [_sample(7, 6) for _ in range(4)]
    buckets = grpo_trainer._length_buckets(samples)
    assert [len(b) for b in buckets] == [100, 4]
    assert {id(s) for b in buckets for s in b} == {id(s) for s in samples}
    even = [_sample(7, 3) for _ in range(100)] + [_sample(7, 4) for _ in range(100)]
    assert len(grpo_trainer._length_buckets(even)) == 1  # 100 positions saved: not worth a pass


def _trainer(directory: Path) -> GrpoTrainer:
    model, tokenizer = build_model(directory)
    return GrpoTrainer(
        model, pad_token_id=int(tokenizer.pad_token_id), settings=GrpoSettings(learning_rate=1e-3)
    )


def test_two_passes_and_skipped_rows_give_the_one_pass_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "model"
    model, tokenizer = build_model(directory)
    batches = [
        sampled_batch(model, tokenizer, step=s, prompts=PROMPTS, generations=4, advantages_seed=s)
        for s in range(2)
    ]
    for batch in batches:  # one group of each batch has all-zero advantages: it is skipped
        for g in range(4):
            key = f"{batch.groups[0].group_id}_g{g}"
            row = dict(batch.rows[key])
            row["advantages"] = np.zeros_like(np.asarray(row["advantages"]))
            batch.rows[key] = row  # type: ignore[index]  # the test's own dict of rows
    one, two = _trainer(directory), _trainer(directory)
    for batch in batches:
        with monkeypatch.context() as patch:
            patch.setattr(grpo_trainer, "_length_buckets", lambda samples: [samples])
            patch.setattr(GrpoTrainer, "_with_gradient", lambda self, samples: samples)
            expected = asyncio.run(one.train_step(batch))
        with monkeypatch.context() as patch:
            patch.setattr(grpo_trainer, "_PASS_COST_TOKENS", 0)  # split whenever it saves a token
            got = asyncio.run(two.train_step(batch))
        for name, value in expected.items():
            if name != "mean_ratio":  # over the trained tokens only: checked below
                assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
        if batch is batches[0]:  # on-policy: every trained token's ratio is 1
            assert got["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
        assert 0.5 < got["mean_ratio"] < 2.0
        for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            scale = float(a.grad.abs().max()) + 1e-12
            assert float((a.grad - b.grad).abs().max()) / scale <= 3e-5
    for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=2e-5)


def test_a_step_whose_rows_all_have_zero_advantage_steps_with_zero_gradients(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "model"
    model, tokenizer = build_model(directory)
    batch = sampled_batch(model, tokenizer, step=0, prompts=PROMPTS, generations=4)
    for key, row in list(batch.rows.items()):
        batch.rows[key] = {**row, "advantages": np.zeros_like(np.asarray(row["advantages"]))}  # type: ignore[index]
    trainer = _trainer(directory)
    metrics = asyncio.run(trainer.train_step(batch))
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert metrics["response_tokens"] == sum(
        int(np.asarray(r["token_mask"]).sum()) for r in batch.rows.values()
    )
    for parameter in trainer.model.parameters():  # AdamW stepped on zeros, as before
        assert parameter.grad is not None and not parameter.grad.any()
    assert trainer.steps_trained == 1
