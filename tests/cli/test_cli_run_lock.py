"""One writer per checkpoint directory, and ``force_fresh`` deletes only what is rollvault's.

Real ``rollvault run`` processes: a second run on a directory in use is
refused at once (exit 2, naming the holder) and changes nothing, while the
first finishes with every prompt trained exactly once. The first is stopped
(SIGSTOP, by its pid) while the second tries: it still holds the directory, and
it cannot finish before the second has been refused, however slow the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zygote_slot import ROLLVAULT_CLI, ZygoteSlot

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.durable.run_lock import RUN_LOCK_FILENAME


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rollvault.cli.main",
        "run",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        "dataset.num_prompts=32",
        "grpo.max_num_epochs=1",
        "grpo.max_num_steps=4",
        *extra,
    ]


# Commands fork from one process that has imported the command line once.
CLI = ZygoteSlot(ROLLVAULT_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # The arguments after ``python -m rollvault.cli.main``.
    return CLI.run(_args(tmp_path, *extra)[3:], os.environ)


def _wait_for(path: Path, child: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert child.poll() is None, "the first run ended before it started"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)  # a poll of the disk, not a synchronization


@pytest.mark.slow
def test_a_second_run_on_the_same_directory_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    # A few seconds of simulated generation after the start: it runs on long after
    # the incarnation file appears, and the stop below holds it there.
    first = subprocess.Popen(
        _args(tmp_path, "gate.simulated.latency_per_token_s=0.005"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "logs" / "incarnation", first)
        os.kill(first.pid, signal.SIGSTOP)
        second = _run(tmp_path)
        assert second.returncode == 2, second.stderr
        message = " ".join(second.stderr.split())
        assert f"pid {first.pid}" in message and "in use by another run" in message
        assert "Traceback" not in second.stderr
        # Still running, and the incarnation counter is the first run's only.
        assert first.poll() is None
        assert (tmp_path / "logs" / "incarnation").read_text() == "1"
        os.kill(first.pid, signal.SIGCONT)
        _, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    assert first.returncode == 0, first_err
    history = read_run_history(tmp_path / "logs")
    assert check_exactly_once(history, {(0, str(idx)) for idx in range(32)}) == []
    # Released at exit: the next start takes the directory (and resumes the finished run).
    assert _run(tmp_path).returncode == 0


@pytest.mark.slow
def test_force_fresh_refuses_a_log_dir_that_is_not_rollvaults(tmp_path: Path) -> None:
    assert _run(tmp_path).returncode == 0
    foreign = tmp_path / "other_logs"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("not a log")
    fresh = ("rollout_checkpointing.restore_mode=none", "rollout_checkpointing.force_fresh=true")
    refused = _run(tmp_path, *fresh, f"logging.log_dir={foreign}")
    assert refused.returncode == 2
    assert "not provably rollvault's" in " ".join(refused.stderr.split())
    assert (foreign / "thesis.tex").read_text() == "not a log"
    assert (tmp_path / "ckpt" / "bootstrap" / "manifest.json").is_file()
    # Its own logs and checkpoints are deleted, the run lock file is kept.
    restarted = _run(tmp_path, *fresh)
    assert restarted.returncode == 0, restarted.stderr
    assert "restore at start" not in restarted.stderr
    assert (tmp_path / "logs" / "incarnation").read_text() == "1"
    assert (tmp_path / "ckpt" / RUN_LOCK_FILENAME).is_file()
