"""Driving the child: start ``rollvault run``, kill it with SIGKILL as planned, restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Final

from rollvault.checkpoint_tools.chaos.checks import check_finished_run
from rollvault.checkpoint_tools.chaos.kill_evidence import (
    KILL_EVIDENCE_FILENAME,
    read_kill_evidence,
    write_kill_evidence,
)
from rollvault.checkpoint_tools.chaos.loss import durable_loss_problems, loss_account
from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    ChaosUsageError,
    KillPoint,
    StepsKill,
    TimerKill,
    chaos_config,
    child_command,
    kill_schedule,
    run_overrides,
)
from rollvault.checkpoint_tools.chaos.progress import TrainStepWatch
from rollvault.checkpoint_tools.chaos.report import ChaosReport, StartOutcome, StartRecord
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.pipeline import INCARNATION_FILENAME
from rollvault.controller.loop.run_logs import TRAIN_LOG_FILENAME

CHILD_OUTPUT_FILENAME: Final = "child_output.log"
_POLL_S: Final = 0.01
"""How long each wait for the child's exit lasts before the harness looks at its files again."""


def run_chaos(plan: ChaosPlan) -> ChaosReport:
    """Start, kill and restart the run as planned, let it finish, then check it."""
    config = chaos_config(plan)
    if plan.run_dir.exists():
        raise ChaosUsageError(f"{plan.run_dir} exists; the harness needs a fresh directory")
    plan.run_dir.mkdir(parents=True)
    report = ChaosReport(plan=plan, config=config)
    started = time.perf_counter()
    overrides = run_overrides(plan)
    kills: list[KillPoint | None] = [*kill_schedule(plan), None]
    with open(plan.run_dir / CHILD_OUTPUT_FILENAME, "ab") as output:
        for number, kill in enumerate(kills, start=1):
            record = _one_start(plan, config, overrides, number, kill, output)
            report.starts.append(record)
            if record.outcome is not StartOutcome.KILLED:
                break
            # Before the next start: its restore rotates the journals the kill left.
            incarnation = _read_incarnation(Path(config.logging.log_dir) / INCARNATION_FILENAME)
            report.kill_evidence.append(
                read_kill_evidence(config, start=number, incarnation=incarnation)
            )
    write_kill_evidence(plan.run_dir / KILL_EVIDENCE_FILENAME, report.kill_evidence)
    report.start_problems = _start_problems(report)
    if report.starts[-1].outcome is StartOutcome.FINISHED:
        report.check = check_finished_run(config)
        report.loss = loss_account(report.check.history, report.kill_evidence)
        report.check.problems.extend(report.loss.problems)
        report.check.problems.extend(durable_loss_problems(config, report.loss))
    report.seconds = time.perf_counter() - started
    return report


def _one_start(
    plan: ChaosPlan,
    config: RunConfig,
    overrides: list[str],
    number: int,
    kill: KillPoint | None,
    output: IO[bytes],
) -> StartRecord:
    log_dir = Path(config.logging.log_dir)
    before = _read_incarnation(log_dir / INCARNATION_FILENAME)
    output.write(f"\n=== start {number} (kill {_describe(kill)}) ===\n".encode())
    output.flush()
    spawned = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
        child_command(plan.config_path, overrides),
        stdout=output,
        stderr=subprocess.STDOUT,
        cwd=plan.run_dir,
    )
    try:
        outcome = _supervise(child, plan, log_dir, before, kill)
    finally:
        _kill_if_running(child)
    return StartRecord(
        number=number,
        outcome=outcome,
        exit_code=child.returncode,
        seconds=time.perf_counter() - spawned,
        kill_delay_s=kill.delay_s if isinstance(kill, TimerKill) else None,
        kill_after_steps=kill.steps if isinstance(kill, StepsKill) else None,
    )


def _describe(kill: KillPoint | None) -> str:
    if isinstance(kill, TimerKill):
        return f"after {kill.delay_s}s"
    if isinstance(kill, StepsKill):
        return f"after {kill.steps} train steps"
    return "none"


def _supervise(
    child: subprocess.Popen[bytes],
    plan: ChaosPlan,
    log_dir: Path,
    before: int,
    kill: KillPoint | None,
) -> StartOutcome:
    deadline = time.monotonic() + plan.start_timeout_s
    incarnation = (
        None
        if kill is None
        else _wait_for_start(child, log_dir / INCARNATION_FILENAME, before, deadline)
    )
    if (
        incarnation is not None
        and kill is not None
        and _kill_point_reached(child, kill, log_dir, incarnation, deadline)
    ):
        _kill_if_running(child)
        return StartOutcome.KILLED
    exit_code = _exited_within(child, max(0.0, deadline - time.monotonic()))
    if exit_code is None:
        return StartOutcome.TIMED_OUT
    return StartOutcome.FINISHED if exit_code == 0 else StartOutcome.FAILED


def _kill_point_reached(
    child: subprocess.Popen[bytes],
    kill: KillPoint,
    log_dir: Path,
    incarnation: int,
    deadline: float,
) -> bool:
    """Whether the started child is still running when its kill point comes
    (False also when the start timeout comes first: the start then timed out)."""
    if isinstance(kill, TimerKill):
        left = max(0.0, deadline - time.monotonic())
        return _exited_within(child, min(kill.delay_s, left)) is None and kill.delay_s <= left
    watch = TrainStepWatch(log_dir / TRAIN_LOG_FILENAME, incarnation)
    return _wait_for_steps(child, watch, kill.steps, deadline)


def _wait_for_start(
    child: subprocess.Popen[bytes], incarnation_path: Path, before: int, deadline: float
) -> int | None:
    """The child's incarnation once it counted it (None: it exited or timed out first)."""
    while time.monotonic() < deadline:
        incarnation = _read_incarnation(incarnation_path)
        if incarnation > before:
            return incarnation
        if _exited_within(child, _POLL_S) is not None:
            return None
    return None


def _wait_for_steps(
    child: subprocess.Popen[bytes], watch: TrainStepWatch, steps: int, deadline: float
) -> bool:
    """Whether the child logged ``steps`` train steps (False: it exited or timed out first)."""
    while time.monotonic() < deadline:
        if watch.steps() >= steps:
            return True
        if _exited_within(child, _POLL_S) is not None:
            return False
    return False


def _exited_within(child: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The child's exit code if it exits within ``seconds``, else None."""
    try:
        return child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _kill_if_running(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child we started, unless it already exited, and reap it."""
    # poll() reaps an exited child; until it is reaped its pid cannot be reused,
    # so the kill below can only reach our own child.
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def _read_incarnation(path: Path) -> int:
    # Written by atomic rename, so a read sees the old or the new count, never half.
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return 0


def _start_problems(report: ChaosReport) -> list[str]:
    problems = []
    last = report.starts[-1]
    if last.outcome is StartOutcome.FAILED:
        problems.append(
            f"start {last.number} exited with code {last.exit_code}; its output is in "
            f"{report.plan.run_dir / CHILD_OUTPUT_FILENAME}"
        )
    elif last.outcome is StartOutcome.TIMED_OUT:
        problems.append(
            f"start {last.number} did not finish within {report.plan.start_timeout_s:.0f}s"
        )
    if report.kills_delivered < report.plan.kills:
        problems.append(
            f"only {report.kills_delivered} of {report.plan.kills} kills landed before the run "
            "ended; lengthen the run (e.g. more dataset.num_prompts), or shorten --kill-window "
            "or lower --kill-after-steps"
        )
    return problems
