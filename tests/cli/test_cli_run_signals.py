"""Preemption on real ``rollvault run`` processes: SIGTERM and SIGINT stop the run in order.

A scheduler (SLURM, Kubernetes, spot reclaim) sends SIGTERM and SIGKILL a
grace period later. Each test starts the command, waits until it has sealed
some attempts, signals it (only the child it started, by its pid), and checks
the exit code, the absence of a traceback, the final snapshot and that a
restart keeps everything sealed before the signal. Every start is forked from
one process that has imported the command line, torch and the model recipes
once (``child_zygote``, ``rollvault_model_cli.py``): a new Python's imports
are most of a GRPO-recipe start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from child_zygote import ForkedChild
from zygote_slot import ROLLVAULT_MODEL_CLI, ZygoteSlot

import rollvault
from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    check_sibling_reuse,
    read_run_history,
)
from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    SHUTDOWNS_LOG_FILENAME,
    ShutdownLogRecord,
    read_jsonl,
)
from rollvault.durable.run_lock import RUN_LOCK_FILENAME
from rollvault.durable.snapshot_dirs import committed_snapshot_paths
from rollvault.ledger.statuses import RolloutAttemptStatus

pytestmark = pytest.mark.slow

GRPO_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition.yaml"
NUM_PROMPTS = 48
# A run of several seconds that ends by data exhaustion (48 prompts, 4 per step).
SIMULATED = (
    f"dataset.num_prompts={NUM_PROMPTS}",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_epochs=1",
    "grpo.max_num_steps=1000",
    "rollout.max_inflight_prompts=6",
    "rollout.max_buffered_rollouts=8",
    "gate.simulated.median_response_tokens=8",
    "gate.simulated.max_response_tokens=64",
    "gate.simulated.latency_per_token_s=0.01",
    "reward.max_response_tokens=48",
    "rollout_checkpointing.interval_s=0.5",
    "checkpointing.save_period=4",
)
START_TIMEOUT_S = 120.0

CLI = ZygoteSlot(ROLLVAULT_MODEL_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


class Started:
    """A ``rollvault run`` that runs while the test signals it (by its pid), as on a ``Popen``."""

    def __init__(self, child: ForkedChild, stderr: Path) -> None:
        self._child = child
        self.pid = child.pid
        self.stderr_path = stderr

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self) -> int:
        return self._child.wait()

    def stderr(self) -> str:
        """What the child has written to stderr so far (nothing before it opened the file)."""
        try:
            return self.stderr_path.read_text()
        except FileNotFoundError:
            return ""

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never a pid that may have been reused
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Run:
    """One ``rollvault run`` child process on the run directory ``tmp_path``."""

    def __init__(self, tmp_path: Path, *overrides: str, config: Path | None = None) -> None:
        self.log_dir = tmp_path / "logs"
        self.checkpoint_dir = tmp_path / "ckpt"
        self.arguments = [
            "run",
            *(["--config", str(config)] if config else []),
            f"logging.log_dir={self.log_dir}",
            f"checkpointing.checkpoint_dir={self.checkpoint_dir}",
            "logging.progress=false",
            *overrides,
        ]
        self.cwd = tmp_path
        self.starts = 0

    def start(self, *more: str) -> Started:
        self.starts += 1
        stderr = self.cwd / f"start_{self.starts}.err"
        child = CLI.zygote.start(
            [*self.arguments, *more],
            os.environ,
            stdout=Path(os.devnull),
            stderr=stderr,
            cwd=self.cwd,
        )
        return Started(child, stderr)

    def finish(self, *more: str) -> subprocess.CompletedProcess[str]:
        """A start that runs to its end."""
        return CLI.run([*self.arguments, *more], os.environ, cwd=self.cwd)

    def wait_for_attempts(self, child: Started, count: int) -> None:
        """Until the child has logged ``count`` attempts (it must still be running)."""
        log = self.log_dir / ATTEMPTS_LOG_FILENAME
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if log.exists() and log.read_bytes().count(b"\n") >= count:
                return
            assert child.poll() is None, "the run ended before it was signalled"
            time.sleep(0.02)  # a poll of the disk, not a synchronization
        child.kill()
        child.wait()
        pytest.fail(f"the run did not log {count} attempts within {START_TIMEOUT_S:.0f}s")

    def sealed(self, incarnation: int) -> set[tuple[str, int]]:
        history = read_run_history(self.log_dir)
        return {
            (a.group_id, a.generation_index)
            for a in history.attempts
            if a.incarnation == incarnation and a.status is RolloutAttemptStatus.SEALED
        }

    def shutdowns(self) -> list[ShutdownLogRecord]:
        return read_jsonl(self.log_dir / SHUTDOWNS_LOG_FILENAME, ShutdownLogRecord)

    def committed_snapshots(self) -> set[Path]:
        return {
            path
            for root in self.checkpoint_dir.glob("*/rollout_snapshots")
            for path in committed_snapshot_paths(root)
        }


def _communicate(child: Started, timeout: float = 120) -> tuple[int, str]:
    """The child's exit status and stderr, once it exits; a failure if not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (code := child.poll()) is None:
        if time.monotonic() >= deadline:  # do not leave our child running
            child.kill()
            child.wait()
            pytest.fail(f"the run did not exit within {timeout:.0f}s of the signal")
        time.sleep(0.02)  # a poll of the child's exit, not a synchronization
    return code, child.stderr()


def _first_line(child: Started) -> str:
    """The child's first line on stderr, once it is written."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while "\n" not in (text := child.stderr()):
        assert child.poll() is None, f"the run ended before it wrote a line: {text}"
        assert time.monotonic() < deadline, "the run wrote no line"
        time.sleep(0.02)  # a poll of the file, not a synchronization
    return text.split("\n", 1)[0]


def _wait_for_line(child: Started, text: str) -> None:
    """Until the child has written a whole line containing ``text`` to stderr."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not any(text in line for line in _whole_lines(child)):
        assert child.poll() is None, f"the run ended before it wrote {text!r}: {child.stderr()}"
        assert time.monotonic() < deadline, f"the run did not write {text!r}: {child.stderr()}"
        time.sleep(0.02)  # a poll of the file, not a synchronization


def _whole_lines(child: Started) -> list[str]:
    """The child's lines on stderr so far, without one it is still writing."""
    text = child.stderr()
    return text[: text.rfind("\n") + 1].splitlines()


def _expected() -> set[tuple[int, str]]:
    return {(0, str(index)) for index in range(NUM_PROMPTS)}


def test_sigterm_writes_a_final_snapshot_and_a_restart_keeps_every_sealed_sibling(
    tmp_path: Path,
) -> None:
    # No periodic snapshot: with one every 0.5 s, a signal while the buffer is full and the
    # trainer busy can find nothing changed since the last one, and then (rightly) no final
    # snapshot is written. 40 attempts are fewer than the first trainer checkpoint's 4 steps,
    # so the seals since the start are unsaved at the signal and a final snapshot is due.
    run = Run(tmp_path, *SIMULATED, "rollout_checkpointing.interval_s=3600")
    child = run.start()
    run.wait_for_attempts(child, 40)
    before_signal = run.committed_snapshots()
    assert not before_signal, "a snapshot before the signal: it may leave nothing to write"
    # The file system's clock, which stamps the snapshot's files (coarser than time.time()).
    marker = tmp_path / "signalled"
    marker.touch()
    signalled_at = marker.stat().st_mtime
    child.send_signal(signal.SIGTERM)
    code, stderr = _communicate(child)

    assert code == 143, stderr
    assert "Traceback" not in stderr
    [stopped] = run.shutdowns()
    assert stopped.signal == "SIGTERM" and not stopped.grace_exceeded
    final = stopped.final_snapshot
    assert final is not None
    assert (Path(final) / "manifest.json").stat().st_mtime >= signalled_at
    # The line on stderr says where to resume: the checkpoint directory and the snapshot.
    [line] = [line for line in stderr.splitlines() if "stopped by SIGTERM" in line]
    assert str(run.checkpoint_dir) in line and final in line
    sealed_before = run.sealed(incarnation=1)
    assert sealed_before

    restart = run.finish()

    assert restart.returncode == 0, restart.stderr
    history = read_run_history(run.log_dir)
    assert [r.snapshot for r in history.restores] == [final]
    assert history.restores[0].attempts_redispatched == stopped.attempts_in_flight
    assert check_exactly_once(history, _expected()) == []
    assert check_sibling_reuse(history) == []
    assert not sealed_before & run.sealed(incarnation=2), "a sibling sealed before was redone"


def test_sigint_stops_the_run_with_exit_code_130(tmp_path: Path) -> None:
    run = Run(tmp_path, *SIMULATED)
    child = run.start()
    run.wait_for_attempts(child, 20)
    child.send_signal(signal.SIGINT)
    code, stderr = _communicate(child)
    assert code == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    [stopped] = run.shutdowns()
    assert stopped.signal == "SIGINT" and stopped.final_snapshot is not None


def test_a_second_signal_exits_at_once_and_the_directory_still_resumes(tmp_path: Path) -> None:
    run = Run(tmp_path, *SIMULATED)
    child = run.start()
    run.wait_for_attempts(child, 20)
    # Two different signals: the kernel merges a signal sent while the same one is
    # still pending, never two different ones.
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGINT)
    code, stderr = _communicate(child, timeout=30)
    assert code in (130, 143), stderr
    assert "Traceback" not in stderr
    assert "second signal" in stderr and "exiting now" in stderr
    # The orderly stop did not finish: no stop report, no shutdown record.
    assert "stopped by" not in stderr and run.shutdowns() == []
    restart = run.finish()
    assert restart.returncode == 0, restart.stderr
    assert check_exactly_once(read_run_history(run.log_dir), _expected()) == []


def test_past_the_grace_the_run_still_exits_143_and_says_what_a_restart_uses(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, *SIMULATED, "rollout_checkpointing.shutdown_grace_s=1e-6")
    child = run.start()
    run.wait_for_attempts(child, 40)
    # A snapshot to fall back on.
    deadline = time.monotonic() + START_TIMEOUT_S
    while not run.committed_snapshots() and time.monotonic() < deadline:
        assert child.poll() is None, "the run ended before it was signalled"
        time.sleep(0.02)  # a poll of the disk, not a synchronization
    assert run.committed_snapshots(), "no rollout snapshot committed before the signal"
    child.send_signal(signal.SIGTERM)
    code, stderr = _communicate(child)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    assert "the last committed snapshot is what a restart will use" in stderr
    [stopped] = run.shutdowns()
    assert stopped.grace_exceeded and stopped.final_snapshot is None
    restart = run.finish()
    assert restart.returncode == 0, restart.stderr
    history = read_run_history(run.log_dir)
    # The snapshot named, or a newer one of the same anchor that a thread was
    # committing as the process exited.
    [restored] = [r.snapshot for r in history.restores]
    assert stopped.resume_from is not None and restored is not None
    assert _anchor(Path(restored)) == _anchor(Path(stopped.resume_from))
    assert check_exactly_once(history, _expected()) == []


def _anchor(snapshot: Path) -> Path:
    """``step_<N>`` (or ``bootstrap``) of ``.../rollout_snapshots/snapshot_<seq>`` or ``.../rollout_state``."""
    return (
        snapshot.parent.parent if snapshot.parent.name == "rollout_snapshots" else snapshot.parent
    )


def _generation_workers(parent: int) -> list[int]:
    """Pids of the ``spawn`` children of ``parent`` (Linux /proc), the resource tracker aside."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"spawn_main" in command:
            workers.append(int(stat.parent.name))
    return workers


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_the_grpo_recipe_and_its_children(tmp_path: Path) -> None:
    # The recipe's trainer is a process of its own (trainer.placement: process): two
    # spawned children, the generation worker and the trainer; neither may outlive it.
    run = Run(
        tmp_path,
        "trainer.warmup.steps=0",
        "logging.tensorboard=false",
        f"model.path={tmp_path / 'model'}",
        config=GRPO_RECIPE,
    )
    child = run.start()
    run.wait_for_attempts(child, 40)
    children = _generation_workers(child.pid)
    assert len(children) == 2, children
    child.send_signal(signal.SIGTERM)
    code, stderr = _communicate(child)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    assert not any(_is_running(pid) for pid in children), "a child outlived the run"
    [stopped] = run.shutdowns()
    assert not stopped.grace_exceeded and stopped.resume_from is not None
    # No final snapshot when a periodic one had just committed and nothing sealed since
    # (under load, seconds can pass without a seal): then that one is the run's state.
    if stopped.final_snapshot is not None:
        assert stopped.resume_from == stopped.final_snapshot
    # A restart restores that snapshot and trains on (one more step: then it ends).
    restart = run.finish(f"grpo.max_num_steps={stopped.trainer_version + 1}")
    assert restart.returncode == 0, restart.stderr
    assert [r.snapshot for r in read_run_history(run.log_dir).restores] == [stopped.resume_from]


def test_sigterm_during_the_warm_up_exits_143_before_anything_is_written(tmp_path: Path) -> None:
    # Outside the event loop the signal ends the command where it is: nothing of the
    # run's checkpoint directory is being written while the model warms up.
    run = Run(
        tmp_path,
        "trainer.warmup.steps=100000",
        "logging.tensorboard=false",
        f"model.path={tmp_path / 'model'}",
        config=GRPO_RECIPE,
    )
    child = run.start()
    announced = _first_line(child)
    assert "preparing the policy" in announced, announced
    # Said before the first of its 100,000 steps: the signal comes during the warm-up.
    _wait_for_line(child, "warm-up: started, 100000 supervised steps")
    child.send_signal(signal.SIGTERM)
    code, stderr = _communicate(child)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    assert "SIGTERM while not training: exiting" in stderr
    # Nothing was written but the run lock, which the start takes first.
    assert sorted(p.name for p in run.checkpoint_dir.iterdir()) == [RUN_LOCK_FILENAME]


def test_sigkill_leaves_no_trainer_process_and_the_run_resumes(tmp_path: Path) -> None:
    # trainer.placement=process: the trainer is a second spawned child. Neither it nor
    # the generation worker may outlive a controller killed without a chance to stop them.
    run = Run(
        tmp_path,
        "trainer.warmup.steps=0",
        "logging.tensorboard=false",
        "trainer.placement=process",
        "grpo.max_num_steps=12",
        "checkpointing.save_period=4",
        "rollout_checkpointing.interval_s=0.5",
        f"model.path={tmp_path / 'model'}",
        config=GRPO_RECIPE,
    )
    child = run.start()
    run.wait_for_attempts(child, 3 * 128)  # a few steps
    # And a committed snapshot: killed before the first (a loaded CI machine), the
    # restart resumes from the seal journal alone, which this test is not about.
    deadline = time.monotonic() + START_TIMEOUT_S
    while not run.committed_snapshots() and time.monotonic() < deadline:
        assert child.poll() is None, "the run ended before it was killed"
        time.sleep(0.05)  # a poll of the disk, not a synchronization
    assert run.committed_snapshots(), "no rollout snapshot committed before the kill"
    children = _generation_workers(child.pid)
    assert len(children) == 2, children  # the generation worker and the trainer
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30.0
    while any(_is_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)  # a poll of the processes, not a synchronization
    assert not any(_is_running(pid) for pid in children), "a child outlived the killed run"
    restart = run.finish()
    assert restart.returncode == 0, restart.stderr
    history = read_run_history(run.log_dir)
    assert len(history.restores) == 1 and history.restores[0].snapshot is not None
    # Every step trained once in the effective timeline, each prompt in one step only.
    assert sorted(history.steps) == list(range(12))
    prompts = [t.sample_id for step in history.steps.values() for t in step]
    assert len(prompts) == 12 * 16 and len(set(prompts)) == len(prompts)
