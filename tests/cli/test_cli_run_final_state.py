"""What a finished ``rollvault run`` leaves behind: its last step is durable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollvault.durable.trainer_checkpoints import trainer_checkpoint_steps


@pytest.mark.slow
def test_the_last_step_gets_a_trainer_checkpoint_off_the_save_period(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollvault.cli.main",
            "run",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "logging.progress=false",
            "grpo.max_num_steps=60",
            "checkpointing.save_period=50",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # step_50 by the period, step_60 because it is the last; older ones pruned as usual.
    assert trainer_checkpoint_steps(tmp_path / "ckpt")[-2:] == [50, 60]
