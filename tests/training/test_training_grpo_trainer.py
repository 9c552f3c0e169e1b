"""The GRPO trainer: a checkpoint round trip reproduces the next step exactly; safe files."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch
from safetensors.torch import load, load_file, save_file

from rollvault.controller.loop.trainer import TrainBatchError, TrainerCheckpointError
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.trainer_files import (
    MODEL_FILENAME,
    OPTIMIZER_FILENAME,
    REFERENCE_FILENAME,
    STATE_FILENAME,
)

PROMPTS = ["07+35=", "61+9=", "99+99="]


def _trainer(directory: Path, *, kl_coef: float = 0.0) -> GrpoTrainer:
    model, tokenizer = build_model(directory)
    settings = GrpoSettings(learning_rate=1e-3, kl_coef=kl_coef)
    return GrpoTrainer(model, pad_token_id=int(tokenizer.pad_token_id), settings=settings)


def _batches(trainer: GrpoTrainer, directory: Path, steps: int) -> list:
    _, tokenizer = build_model(directory)
    return [
        sampled_batch(
            trainer.model,
            tokenizer,
            step=step,
            prompts=PROMPTS,
            generations=4,
            advantages_seed=step,
        )
        for step in range(steps)
    ]


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_a_checkpoint_round_trip_reproduces_the_next_step_exactly(
    tmp_path: Path, kl_coef: float
) -> None:
    trainer = _trainer(tmp_path / "model", kl_coef=kl_coef)
    batches = _batches(trainer, tmp_path / "model", 3)
    asyncio.run(trainer.train_step(batches[0]))
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    trainer.save_checkpoint(checkpoint)
    expected = asyncio.run(trainer.train_step(batches[1]))
    expected_weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    # A fresh trainer (fresh optimizer, other RNG state) loads the checkpoint ...
    torch.manual_seed(12345)
    restored = _trainer(tmp_path / "model", kl_coef=kl_coef)
    restored.load_checkpoint(checkpoint)
    assert restored.steps_trained == 1
    # ... and the next step is bit-for-bit the same: loss, clip, norms and weights.
    again = asyncio.run(restored.train_step(batches[1]))
    assert again == expected
    for name, tensor in restored.model.state_dict().items():
        assert torch.equal(tensor, expected_weights[name]), name
    if kl_coef:
        assert expected["kl"] > 0


def test_checkpoint_files_are_safetensors_and_json(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model", kl_coef=0.1)
    asyncio.run(trainer.train_step(_batches(trainer, tmp_path / "model", 1)[0]))
    trainer.save_checkpoint(tmp_path)
    names = {p.name for p in tmp_path.iterdir() if p.is_file()}
    assert names == {MODEL_FILENAME, REFERENCE_FILENAME, OPTIMIZER_FILENAME, STATE_FILENAME}
    optimizer = load_file(str(tmp_path / OPTIMIZER_FILENAME))
    assert "rng.torch_cpu" in optimizer
    assert any(key.endswith(".exp_avg_sq") for key in optimizer)
    state = json.loads((tmp_path / STATE_FILENAME).read_text())
    assert state["schema_version"] == 1 and state["steps_trained"] == 1
    assert state["param_groups"][0]["lr"] == pytest.approx(1e-3)


def test_damaged_or_mismatched_checkpoints_are_refused_naming_the_file(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model")
    trainer.save_checkpoint(tmp_path)
    state_path = tmp_path / STATE_FILENAME
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({**state, "schema_version": 9}))
    with pytest.raises(TrainerCheckpointError, match="unsupported schema_version 9"):
        trainer.load_checkpoint(tmp_path)
    state_path.write_text(json.dumps({**state, "surprise": 1}))
    with pytest.raises(TrainerCheckpointError, match="surprise"):
        trainer.load_checkpoint(tmp_path)
    state_path.write_text(json.dumps(state))
    weights = load_file(str(tmp_path / MODEL_FILENAME))
    weights.pop(next(iter(weights)))
    save_file(weights, str(tmp_path / MODEL_FILENAME))
    with pytest.raises(TrainerCheckpointError, match=MODEL_FILENAME):
        trainer.load_checkpoint(tmp_path)
    (tmp_path / MODEL_FILENAME).write_bytes(b"\x00" * 5)
    with pytest.raises(TrainerCheckpointError, match=MODEL_FILENAME):
        trainer.load_checkpoint(tmp_path)
    with pytest.raises(TrainerCheckpointError, match="has_reference"):
        _trainer(tmp_path / "model", kl_coef=0.1).load_checkpoint(tmp_path)


def test_a_step_reports_reward_accuracy_and_moves_the_weights(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model")
    batch = _batches(trainer, tmp_path / "model", 1)[0]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = asyncio.run(trainer.train_step(batch))
    # sampled_batch gives odd siblings reward 1.0 and even ones 0.0, and marks
    # only sibling 0 of 4 correct: accuracy is the rows' verdict, not their reward.
    assert metrics["reward_mean"] == pytest.approx(0.5)
    assert metrics["accuracy"] == pytest.approx(0.25)
    assert metrics["samples"] == 12 and metrics["groups"] == 3
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_weights_for_gate_are_the_current_weights(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model")
    asyncio.run(trainer.train_step(_batches(trainer, tmp_path / "model", 1)[0]))
    exported = load(trainer.weights_for_gate())
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(exported[name], tensor), name


def test_a_batch_missing_a_row_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model")
    batch = _batches(trainer, tmp_path / "model", 1)[0]
    rows = dict(batch.rows)
    rows.pop(next(iter(rows)))
    with pytest.raises(TrainBatchError, match="lacks canonical row"):
        asyncio.run(trainer.train_step(msgspec.structs.replace(batch, rows=rows)))


def test_masked_and_empty_rows_add_nothing(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "model")
    batch = _batches(trainer, tmp_path / "model", 1)[0]
    rows = dict(batch.rows)
    keys = sorted(rows)
    empty = {
        "input_ids": np.zeros(0, np.int64),
        "generation_logprobs": np.zeros(0, np.float32),
        "token_mask": np.zeros(0, np.int8),
        "advantages": np.zeros(0, np.float32),
        "reward": 0.0,
        "sample_mask": False,
    }
    rows = {key: empty for key in keys}
    metrics = asyncio.run(trainer.train_step(msgspec.structs.replace(batch, rows=rows)))
    assert "loss" not in metrics and trainer.steps_trained == 1


def test_a_checkpoint_on_a_full_filesystem_fails_with_an_oserror(
    tmp_path: Path, small_filesystem: Callable[[int], Path]
) -> None:
    trainer = _trainer(tmp_path)
    directory = small_filesystem(256 << 10) / "trainer"
    directory.mkdir()
    with pytest.raises(OSError, match="No space left on device") as caught:
        trainer.save_checkpoint(directory)
    assert caught.value.errno == errno.ENOSPC


@pytest.mark.parametrize("written", [{}, {"fused": None, "foreach": True}])
def test_a_loaded_checkpoint_keeps_the_trainers_fused_kernel(
    tmp_path: Path, written: dict[str, object]
) -> None:
    """The kernel is the trainer's choice, whatever the checkpoint's groups name (an older
    one names none, another build may name another)."""
    trainer = _trainer(tmp_path / "model")
    assert [(g["fused"], g["foreach"]) for g in trainer._optimizer.param_groups] == [(True, None)]
    trainer.save_checkpoint(tmp_path)
    state_path = tmp_path / STATE_FILENAME
    state = json.loads(state_path.read_text())
    for group in state["param_groups"]:
        group.pop("fused"), group.pop("foreach")
        group.update(written)
    state_path.write_text(json.dumps(state))
    restored = _trainer(tmp_path / "model")
    restored.load_checkpoint(tmp_path)
    assert [(g["fused"], g["foreach"]) for g in restored._optimizer.param_groups] == [(True, None)]
