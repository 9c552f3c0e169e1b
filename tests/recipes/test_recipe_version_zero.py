"""Where a start takes its version-0 policy from: warm up, the saved policy, or a trainer checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollvault.cli.main import main
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.recipes.async_grpo import (
    PolicyStart,
    policy_start,
    prepare,
    version_zero_policy_path,
)
from rollvault.training.grpo_trainer import GrpoTrainer
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.policy_dirs import DamagedPolicyError, publish_policy


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "gate.kind=local_model",
        "trainer.kind=grpo",
        "dataset.kind=addition",
        "dataset.num_prompts=64",
        "trainer.warmup.steps=5",
        f"model.path={tmp_path / 'model'}",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        *extra,
    ]


def _config(tmp_path: Path, *extra: str) -> RunConfig:
    return load_run_config(None, _overrides(tmp_path, *extra))


def _saved_run(config: RunConfig) -> dict[str, torch.Tensor]:
    """A run's anchor and a saved version-0 policy (other weights than ``model.path``'s)."""
    model, tokenizer = load_model_dir(
        ensure_model_dir(Path(config.model.path), build_default=True, seed=config.seed)
    )
    prepare_checkpoint_dir(config)  # the anchor a first start leaves
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.25)
    publish_policy(version_zero_policy_path(config), model, tokenizer, with_digests=True)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_a_fresh_start_warms_up_or_takes_the_model_as_it_is(tmp_path: Path) -> None:
    assert policy_start(_config(tmp_path)) is PolicyStart.WARM_UP
    assert policy_start(_config(tmp_path, "trainer.warmup.steps=0")) is PolicyStart.MODEL


def test_a_restart_before_a_trainer_checkpoint_takes_the_saved_policy(tmp_path: Path) -> None:
    config = _config(tmp_path)
    saved = _saved_run(config)
    assert policy_start(config) is PolicyStart.SAVED
    mode = "rollout_checkpointing.restore_mode=trainer_checkpoint"
    assert policy_start(_config(tmp_path, mode)) is PolicyStart.SAVED
    # restore_mode=none starts fresh: the old run is refused or deleted, never loaded.
    fresh = _config(tmp_path, "rollout_checkpointing.restore_mode=none")
    assert policy_start(fresh) is PolicyStart.WARM_UP
    prepared = prepare(config)
    assert prepared.warmup is None
    assert prepared.policy is not None and prepared.policy.start is PolicyStart.SAVED
    assert isinstance(prepared.policy.trainer, GrpoTrainer)  # trainer.placement=local
    loaded = prepared.policy.trainer.model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_trainer_checkpoint_wins_over_the_saved_policy(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _saved_run(config)
    (tmp_path / "ckpt" / "step_4").mkdir()
    assert policy_start(config) is PolicyStart.TRAINER_CHECKPOINT


def test_a_policy_without_the_run_anchor_beside_it_is_not_loaded(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _saved_run(config)
    (tmp_path / "ckpt" / "bootstrap" / "manifest.json").unlink()
    assert policy_start(config) is PolicyStart.WARM_UP  # a fresh start: nothing checked it


def test_a_damaged_saved_policy_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    _saved_run(config)
    path = version_zero_policy_path(config)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-2] ^= 0x40
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedPolicyError) as info:
        prepare(config)
    assert str(info.value) == (
        f"refusing to load the policy in {path}: {weights}: content changed (digest mismatch) "
        f"(this is the version-0 policy saved after the run's warm-up; delete {path} to warm up "
        "again)"
    )
    assert main(["run", *_overrides(tmp_path)]) == 2
    assert "rollvault run: cannot start: refusing to load the policy" in capsys.readouterr().err
