"""Restore falls back past a damaged trainer checkpoint, on real ``rollvault run`` processes.

64 prompts, 8 per step: 8 steps an epoch. The first run stops at step 12
with ``save_period=8``, so it leaves ``step_8`` and (the last step) ``step_12``.
``step_12`` is then damaged; the restart must resume from ``step_8`` with its
trainer state, say what it skipped and why, and still train every prompt of
both epochs exactly once. The commands are forked from one process that has
imported the command line once (``child_zygote``, ``rollvault_cli.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from zygote_slot import ROLLVAULT_CLI, ZygoteSlot

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_steps

CLI = ZygoteSlot(ROLLVAULT_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


def _rollvault(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return CLI.run([command, *args], os.environ, cwd=tmp_path)


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _rollvault(
        tmp_path,
        "run",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        "checkpointing.save_period=8",
        "dataset.num_prompts=64",
        "grpo.max_num_epochs=2",
        *extra,
    )


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def first_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first run, once for the module: each test damages a copy of it."""
    directory = tmp_path_factory.mktemp("first_run")
    first = _run(directory, "grpo.max_num_steps=12")
    assert first.returncode == 0, first.stderr
    assert trainer_checkpoint_steps(directory / "ckpt") == [8, 12]
    return directory


def _first_run(first_run_dir: Path, tmp_path: Path) -> Path:
    """The first run's logs and checkpoints, copied to ``tmp_path`` (the restart's paths:
    both are operational, so the copy resumes as the original would)."""
    for name in ("logs", "ckpt"):
        shutil.copytree(first_run_dir / name, tmp_path / name, symlinks=True)
    assert trainer_checkpoint_steps(tmp_path / "ckpt") == [8, 12]
    return tmp_path / "ckpt" / "step_12"


def _check_resumed_from_step_8(tmp_path: Path, damaged: Path) -> None:
    second = _run(tmp_path, "grpo.max_num_steps=16")
    assert second.returncode == 0, second.stderr
    assert "resumed at step 8" in second.stderr
    assert f"skipped {tmp_path / 'ckpt' / 'step_12'}:" in second.stderr.replace("\n", "")
    assert str(damaged.name) in second.stderr.replace("\n", "")
    # The damaged checkpoint is kept aside, never read again; the run published step_12 anew.
    assert (tmp_path / "ckpt" / "damaged_step_12").is_dir()
    assert trainer_checkpoint_steps(tmp_path / "ckpt")[-1] == 16
    history = read_run_history(tmp_path / "logs")
    expected = {(epoch, str(idx)) for epoch in range(2) for idx in range(64)}
    assert check_exactly_once(history, expected) == []
    [restore] = history.restores
    assert restore.base_train_step == 8
    assert restore.skipped and restore.skipped[0].startswith(str(tmp_path / "ckpt" / "step_12"))


@pytest.mark.slow
def test_a_damaged_rollout_state_without_snapshots_falls_back_to_the_older_step(
    first_run_dir: Path, tmp_path: Path
) -> None:
    step_12 = _first_run(first_run_dir, tmp_path)
    _flip_middle_byte(step_12 / "rollout_state" / "rollout_recovery.json")
    shutil.rmtree(step_12 / "rollout_snapshots", ignore_errors=True)
    _check_resumed_from_step_8(tmp_path, step_12 / "rollout_state" / "rollout_recovery.json")


@pytest.mark.slow
def test_a_flipped_byte_in_the_trainer_state_is_caught_by_verify_and_skipped(
    first_run_dir: Path, tmp_path: Path
) -> None:
    step_12 = _first_run(first_run_dir, tmp_path)
    state = sorted(p for p in (step_12 / "trainer").rglob("*") if p.is_file())[0]
    _flip_middle_byte(state)
    verify = _rollvault(tmp_path, "verify", str(tmp_path / "ckpt"))
    assert verify.returncode == 1
    assert f"{state}: trainer checkpoint file: content changed" in verify.stdout
    _check_resumed_from_step_8(tmp_path, state)


@pytest.mark.slow
def test_with_every_trainer_checkpoint_damaged_the_restart_is_refused_and_changes_nothing(
    first_run_dir: Path, tmp_path: Path
) -> None:
    step_12 = _first_run(first_run_dir, tmp_path)
    for step in (step_12, tmp_path / "ckpt" / "step_8"):
        _flip_middle_byte(sorted(p for p in (step / "trainer").rglob("*") if p.is_file())[0])
    refused = _run(tmp_path, "grpo.max_num_steps=16")
    assert refused.returncode == 2
    assert "no usable" in refused.stderr and "step_8" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert trainer_checkpoint_steps(tmp_path / "ckpt") == [8, 12]
    assert not (tmp_path / "ckpt" / "damaged_step_12").exists()
