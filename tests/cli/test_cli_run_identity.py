"""What a resume accepts and refuses, on real ``rollvault run`` processes.

Stopping criteria and throughput settings are not the run's meaning: a
finished run can be extended, and its concurrency changed. The model is its
files, not its path: a moved model directory resumes, new weights at the
same path are refused. Every start is forked from one process that has
imported the command line, torch and the model recipes once (``child_zygote``,
``rollvault_model_cli.py``); the GRPO recipe's starts spawn their generation
worker as a new Python, as ever.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from zygote_slot import ROLLVAULT_MODEL_CLI, ZygoteSlot

import rollvault
from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history

GRPO_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition.yaml"


CLI = ZygoteSlot(ROLLVAULT_MODEL_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return CLI.run(["run", *args], os.environ, cwd=cwd)


def _simulated(tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        "checkpointing.save_period=8",
        "dataset.num_prompts=64",
        *extra,
    ]


@pytest.mark.slow
def test_a_finished_run_is_extended_and_trains_every_prompt_once(tmp_path: Path) -> None:
    # 64 prompts, 8 per step: 8 steps an epoch. Stop mid-way through the first epoch.
    first = _run(tmp_path, *_simulated(tmp_path, "grpo.max_num_steps=5", "grpo.max_num_epochs=1"))
    assert first.returncode == 0, first.stderr
    assert len(read_run_history(tmp_path / "logs").steps) == 5
    # 40 of the epoch's 64 prompts trained; the summary says the rest are pending, not lost.
    assert "prompts pending 24" in first.stderr
    # More steps, one more epoch, and another concurrency: all accepted.
    second = _run(
        tmp_path,
        *_simulated(
            tmp_path,
            "grpo.max_num_steps=16",
            "grpo.max_num_epochs=2",
            "rollout.max_inflight_prompts=4",
        ),
    )
    assert second.returncode == 0, second.stderr
    assert "resumed at step 5" in second.stderr  # the last step was checkpointed
    assert "prompts pending" not in second.stderr
    history = read_run_history(tmp_path / "logs")
    assert sorted(history.steps) == list(range(16))
    expected = {(epoch, str(idx)) for epoch in range(2) for idx in range(64)}
    assert check_exactly_once(history, expected) == []


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step simulated run, once for the module: tests resume copies of it."""
    directory = tmp_path_factory.mktemp("two_step_run")
    first = _run(directory, *_simulated(directory, "grpo.max_num_steps=2"))
    assert first.returncode == 0, first.stderr
    return directory


def _copy_run(run_dir: Path, tmp_path: Path) -> None:
    """``run_dir``'s logs and checkpoints at ``tmp_path`` (operational paths: a restart
    there resumes the copy as it would the original)."""
    for name in ("logs", "ckpt"):
        shutil.copytree(run_dir / name, tmp_path / name, symlinks=True)


@pytest.mark.slow
def test_a_semantic_change_is_still_refused(two_step_run: Path, tmp_path: Path) -> None:
    _copy_run(two_step_run, tmp_path)
    refused = _run(tmp_path, *_simulated(tmp_path, "grpo.max_num_steps=4", "seed=3"))
    assert refused.returncode == 2
    assert "seed: 0 -> 3" in refused.stderr
    assert "max_num_steps" not in refused.stderr


def _grpo(tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(GRPO_RECIPE),
        f"model.path={model_dir}",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "trainer.warmup.steps=0",
        "dataset.num_prompts=64",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=2",
        "rollout.max_inflight_prompts=8",
        "rollout.max_buffered_rollouts=8",
        "checkpointing.save_period=2",
        # Where the trainer runs is operational (not part of the run's identity) and not
        # what these tests are about: in the controller's process a start spawns one
        # Python fewer, and a refused start has no trainer process to wait for.
        "trainer.placement=local",
        *extra,
    ]


@pytest.mark.slow
def test_the_model_is_its_files_not_its_path(tmp_path: Path) -> None:
    first_dir = tmp_path / "model_a"
    first = _run(tmp_path, *_grpo(tmp_path, first_dir, "grpo.max_num_steps=2"))
    assert first.returncode == 0, first.stderr
    moved_dir = tmp_path / "model_b"
    shutil.move(first_dir, moved_dir)
    moved = _run(
        tmp_path,
        *_grpo(tmp_path, moved_dir, "grpo.max_num_steps=3", "model.build_default=false"),
    )
    assert moved.returncode == 0, moved.stderr
    assert "resumed at step 2" in moved.stderr
    weights = moved_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight: same shapes, other weights
    weights.write_bytes(bytes(data))
    refused = _run(
        tmp_path,
        *_grpo(tmp_path, moved_dir, "grpo.max_num_steps=4", "model.build_default=false"),
    )
    assert refused.returncode == 2
    assert "model.files.model.safetensors:" in refused.stderr


@pytest.mark.slow
def test_a_damaged_dataset_identity_file_refuses_the_start_and_is_kept(
    two_step_run: Path, tmp_path: Path
) -> None:
    _copy_run(two_step_run, tmp_path)
    record = tmp_path / "ckpt" / "bootstrap" / "dataset_identity.json"
    damaged = record.read_bytes()[:-20]
    record.write_bytes(damaged)
    second = _run(tmp_path, *_simulated(tmp_path, "grpo.max_num_steps=4"))
    assert second.returncode == 2, second.stderr
    assert "cannot start" in second.stderr and "dataset_identity.json" in second.stderr
    assert "Traceback" not in second.stderr
    assert record.read_bytes() == damaged
