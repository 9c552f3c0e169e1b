"""The trainer in a process of its own trains as in the controller's process; it is reaped."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch

from rollvault.config.schema import ModelDType
from rollvault.controller.loop.trainer import TrainerCheckpointError, TrainerLostError
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import ensure_model_dir
from rollvault.training.policy_dirs import load_policy
from rollvault.training.trainer_process import ProcessTrainer

pytestmark = pytest.mark.slow  # spawns a trainer process (imports torch: seconds)

PROMPTS = ["07+35=", "61+9=", "99+99="]
SETTINGS = GrpoSettings(learning_rate=1e-3, kl_coef=0.05, temperature=0.7)


def _local(directory: Path) -> GrpoTrainer:
    model, tokenizer = build_model(directory)
    return GrpoTrainer(model, pad_token_id=int(tokenizer.pad_token_id), settings=SETTINGS)


def _process(directory: Path, trainer: GrpoTrainer) -> ProcessTrainer:
    return ProcessTrainer(
        trainer,
        model_path=ensure_model_dir(directory, build_default=True, seed=0),
        dtype=ModelDType.FLOAT32,
        pad_token_id=0,
        settings=SETTINGS,
    )


def test_steps_checkpoints_and_export_match_the_trainer_in_this_process(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    local = _local(model_dir)
    _, tokenizer = build_model(model_dir)
    with torch.no_grad():  # version-0 weights other than model.path's (a warm-up)
        next(local.model.parameters()).mul_(1.01)
    copy = _local(model_dir)
    copy.model.load_state_dict(local.model.state_dict())
    remote = _process(model_dir, copy)  # starts from copy's weights
    try:
        assert remote.weights_for_gate() == local.weights_for_gate()
        batches = [
            sampled_batch(local.model, tokenizer, step=s, prompts=PROMPTS, generations=4)
            for s in range(2)
        ]
        for batch in batches:
            expected = asyncio.run(local.train_step(batch))
            assert asyncio.run(remote.train_step(batch)) == expected
        assert remote.weights_for_gate() == local.weights_for_gate()

        checkpoint = tmp_path / "ckpt"
        checkpoint.mkdir()
        remote.save_checkpoint(checkpoint)
        restored = _local(model_dir)
        restored.load_checkpoint(checkpoint)
        assert restored.steps_trained == 2
        assert restored.weights_for_gate() == local.weights_for_gate()

        exported = remote.export_policy(tmp_path / "policy", tokenizer, with_digests=True)
        model, _ = load_policy(exported)
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, local.model.state_dict()[name]), name

        with pytest.raises(TrainerCheckpointError, match="trainer process"):
            remote.load_checkpoint(tmp_path / "missing")
        remote.load_checkpoint(checkpoint)  # still serving after a refused command
    finally:
        remote.close()
    assert not remote.is_alive()


def test_sigterm_is_ignored_and_a_killed_trainer_process_ends_the_run(tmp_path: Path) -> None:
    # Reaping when the controller dies (EOF on the pipe) is the CLI's SIGKILL test.
    remote = _process(tmp_path / "model", _local(tmp_path / "model"))
    try:
        remote.weights_for_gate()  # up and serving
        # It ignores SIGTERM (only the controller stops a run in order, final snapshot first).
        os.kill(remote.pid, signal.SIGTERM)
        # An answer to a command sent after the signal shows it survived it, with no wait:
        # a signal left at its default kills the process before it runs again, and a
        # Python handler runs before the command it was waiting for is read.
        remote.weights_for_gate()
        assert remote.is_alive()
        os.kill(remote.pid, signal.SIGKILL)
        with pytest.raises(TrainerLostError, match="is gone"):
            remote.weights_for_gate()
        with pytest.raises(TrainerLostError):
            remote.save_checkpoint(tmp_path)
    finally:
        remote.close()
    assert not remote.is_alive()
