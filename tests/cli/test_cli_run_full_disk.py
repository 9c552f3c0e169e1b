"""``rollvault run`` on a checkpoint directory that fills up: a real 4 MB tmpfs.

With no trainer checkpoint before the end (``save_period=1000``), every
snapshot keeps every trained group's rows and grows, until two committed
snapshots and a new one no longer fit. Each failed snapshot must then be a
warning and be retried; the third in a row stops the run with exit 3 and a
message naming the cause and the newest good snapshot, with no traceback.
That snapshot verifies, and a restart on a bigger disk (the directory
copied) resumes from it and trains every prompt exactly once.

The seal journal and the dispatch journal fill the disk too, and with them
there, which write fails first (a snapshot, a journal) depends on timing: the
snapshot sequence is tested with the seal journal off and the dispatch
journal on another disk, and the default run (both on the small disk) is held
to what holds whichever write fails: exit 3 naming the full disk, no
traceback, and a restart that trains every prompt once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from zygote_slot import ROLLVAULT_CLI, ZygoteSlot

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.cli.run_command import IO_STOP_EXIT_STATUS
from rollvault.controller.loop.dispatch_journal import DISPATCH_JOURNAL_DIRNAME

NUM_PROMPTS = 256
EPOCHS = 3
DISK_BYTES = 3 << 20
"""Full at about two thirds of the run's 96 steps. At 4 MB the third failure in a row came
at step 86-95, and a run fast enough to finish first exited 0 (CI, stop 37)."""


# Commands fork from one process that has imported the command line once.
CLI = ZygoteSlot(ROLLVAULT_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


def _rollvault(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return CLI.run(list(args), os.environ, cwd=cwd)


def _run(tmp_path: Path, checkpoint_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return _rollvault(
        tmp_path,
        "run",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={checkpoint_dir}",
        "logging.progress=false",
        f"dataset.num_prompts={NUM_PROMPTS}",
        f"grpo.max_num_epochs={EPOCHS}",
        "checkpointing.save_period=1000",
        "rollout_checkpointing.interval_s=0.05",
        "rollout_checkpointing.max_consecutive_failures=3",
        "gate.simulated.latency_per_token_s=0.0002",
        *overrides,
    )


def _restart_on_a_bigger_disk(tmp_path: Path, small: Path) -> Path:
    """Copy ``small`` to a roomy directory and run to the end there; check exactly once."""
    big = tmp_path / "big_ckpt"
    shutil.copytree(small, big)
    finished = _run(tmp_path, big)
    assert finished.returncode == 0, finished.stderr
    history = read_run_history(tmp_path / "logs")
    expected = {(epoch, str(idx)) for epoch in range(EPOCHS) for idx in range(NUM_PROMPTS)}
    assert check_exactly_once(history, expected) == []
    return big


@pytest.mark.slow
def test_a_full_checkpoint_disk_stops_the_run_cleanly_and_a_bigger_one_finishes_it(
    tmp_path: Path, small_filesystem: Callable[[int], Path]
) -> None:
    small = small_filesystem(DISK_BYTES) / "ckpt"
    # Only the snapshots fill the small disk: the dispatch journal's lines go to a roomy
    # one. Else, when a failed snapshot leaves fewer bytes than the lines appended before
    # its retry, the journal's own disk-full stop comes first (the second test below
    # holds that path to a clean stop too).
    (tmp_path / "dispatch_journal").mkdir()
    small.mkdir()
    (small / DISPATCH_JOURNAL_DIRNAME).symlink_to(tmp_path / "dispatch_journal")
    stopped = _run(tmp_path, small, "rollout_checkpointing.journal.enabled=false")
    stderr = stopped.stderr.replace("\n", "")  # the console wraps long lines
    assert stopped.returncode == IO_STOP_EXIT_STATUS, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert any((tmp_path / "dispatch_journal").iterdir())  # the journal was written there
    assert "rollvault run: cannot continue: 3 rollout snapshot(s) in a row failed" in stderr
    assert "(rollout_checkpointing.max_consecutive_failures=3)" in stderr
    assert "No space left on device" in stderr
    # The two failures before the last were warnings, each retried after a longer wait.
    assert "rollout snapshot failed (1 in a row; the run stops at 3)" in stderr
    assert "trying again in 0.1 s" in stderr
    assert "rollout snapshot failed (2 in a row; the run stops at 3)" in stderr
    assert "trying again in 0.2 s" in stderr
    named = re.search(r"The newest good snapshot is (\S+): a restart", stderr)
    assert named is not None, stderr
    newest = Path(named.group(1))
    assert newest.parent == small / "bootstrap" / "rollout_snapshots"
    assert newest.name.startswith("snapshot_") and newest.is_dir()
    assert not [p for p in newest.parent.iterdir() if p.name.startswith(("tmp_", "trash_"))]
    verified = _rollvault(tmp_path, "verify", str(small))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "all good" in verified.stdout

    # Space freed: the same run on a bigger disk resumes from that snapshot and finishes.
    big = _restart_on_a_bigger_disk(tmp_path, small)
    [restore] = read_run_history(tmp_path / "logs").restores
    assert restore.snapshot == str(big / newest.relative_to(small))


@pytest.mark.slow
def test_a_full_disk_with_the_seal_journal_stops_cleanly_and_a_restart_trains_once(
    tmp_path: Path, small_filesystem: Callable[[int], Path]
) -> None:
    small = small_filesystem(DISK_BYTES) / "ckpt"
    stopped = _run(tmp_path, small)
    assert stopped.returncode == IO_STOP_EXIT_STATUS, stopped.stderr
    assert "Traceback" not in stopped.stderr
    stderr = stopped.stderr.replace("\n", "")
    assert "rollvault run: cannot continue" in stderr and "No space left on device" in stderr
    _restart_on_a_bigger_disk(tmp_path, small)
