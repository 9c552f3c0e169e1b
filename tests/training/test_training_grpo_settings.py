"""GRPO trainer settings users expect: micro-batching, top-p/top-k logprobs, bfloat16."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch

from rollvault.config.schema import ModelDType, TrainerConfig
from rollvault.controller.loop.trainer import TrainBatch
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import load_model_dir

PROMPTS = ["07+35=", "61+9=", "99+99="]


def _trainer(directory: Path, **settings: float | int | None) -> GrpoTrainer:
    model, tokenizer = build_model(directory)
    return GrpoTrainer(
        model,
        pad_token_id=int(tokenizer.pad_token_id),
        settings=msgspec.structs.replace(GrpoSettings(learning_rate=1e-3), **settings),
    )


def _batches(
    directory: Path, steps: int, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> list[TrainBatch]:
    model, tokenizer = build_model(directory)
    return [
        sampled_batch(
            model,
            tokenizer,
            step=step,
            prompts=PROMPTS,
            generations=4,
            advantages_seed=step,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        )
        for step in range(steps)
    ]


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("micro_batch_size", [2, 5])
def test_micro_batches_give_the_whole_batch_step(
    tmp_path: Path, micro_batch_size: int, kl_coef: float
) -> None:
    directory = tmp_path / "model"
    batches = _batches(directory, 2)
    whole = _trainer(directory, kl_coef=kl_coef)
    micro = _trainer(directory, kl_coef=kl_coef, micro_batch_size=micro_batch_size)
    for batch in batches:  # the second step is off-policy: ratios, clipping and KL move
        expected = asyncio.run(whole.train_step(batch))
        got = asyncio.run(micro.train_step(batch))
        assert set(got) == set(expected)
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
        # The accumulated gradient (left in .grad by the step) is the whole batch's.
        for a, b in zip(whole.model.parameters(), micro.model.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            scale = float(a.grad.abs().max()) + 1e-12
            # 3e-5: a micro-batch runs the shared-prompt pass on other batch shapes than
            # the whole batch (training/shared_prefix.py), which rounds differently;
            # measured up to 1.2e-5 on the second (off-policy) step.
            assert float((a.grad - b.grad).abs().max()) / scale <= 3e-5
    if kl_coef:
        assert expected["kl"] > 0
    # Measured: at most 6e-6 after two steps of lr 1e-3, all of it at weights whose
    # gradient is ~1e-8, where AdamW's first steps (g / (|g| + 1e-8)) turn float
    # rounding of the summation order into a visible difference; elsewhere ~1e-8.
    # With the shared-prompt pass (other batch shapes per micro-batch) up to 1.4e-5.
    worst = max(
        float((micro.model.state_dict()[name] - tensor).abs().max())
        for name, tensor in whole.model.state_dict().items()
    )
    assert worst <= 3e-5, worst
    moved = max(
        float((tensor - build_model(directory)[0].state_dict()[name]).abs().max())
        for name, tensor in whole.model.state_dict().items()
    )
    assert moved > 1e-4  # the steps did change the weights


def test_filtered_sampling_is_on_policy_for_the_trainer(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    [batch] = _batches(directory, 1, temperature=0.8, top_p=0.9, top_k=5)
    same = asyncio.run(_trainer(directory, temperature=0.8, top_p=0.9, top_k=5).train_step(batch))
    assert same["mean_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert same["clip_fraction"] == 0.0
    # The trainer without the gate's filter sees other logprobs: ratios off 1.
    plain = asyncio.run(_trainer(directory, temperature=0.8).train_step(batch))
    assert abs(plain["mean_ratio"] - 1.0) > 1e-2


def test_settings_take_the_config_and_the_gate_sampling() -> None:
    config = TrainerConfig(micro_batch_size=3)
    settings = GrpoSettings.from_config(config, temperature=0.5, top_p=0.8, top_k=7)
    assert (settings.temperature, settings.top_p, settings.top_k) == (0.5, 0.8, 7)
    assert settings.micro_batch_size == 3
    assert GrpoSettings.from_config(TrainerConfig(), temperature=1.0) == (
        GrpoSettings(learning_rate=TrainerConfig().learning_rate)
    )


def test_a_bfloat16_trainer_trains_bfloat16_weights(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    [batch] = _batches(directory, 1)
    model, tokenizer = load_model_dir(directory, dtype=ModelDType.BFLOAT16)
    trainer = GrpoTrainer(
        model, pad_token_id=int(tokenizer.pad_token_id), settings=GrpoSettings(learning_rate=1e-2)
    )
    metrics = asyncio.run(trainer.train_step(batch))
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=2e-2)
    assert np.isfinite(list(metrics.values())).all(), metrics
