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
    chaos_config,
    child_command,
    kill_delays,
    run_overrides,
)
from rollvault.checkpoint_tools.chaos.report import ChaosReport, StartOutcome, StartRecord
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.pipeline import INCARNATION_FILENAME

CHILD_OUTPUT_FILENAME: Final = "child_output.log"
_POLL_S: Final = 0.01


def run_chaos(plan: ChaosPlan) -> ChaosReport:
    """Start, kill and restart the run as planned, let it finish, then check it."""
    config = chaos_config(plan)
    if plan.run_dir.exists():
        raise ChaosUsageError(f"{plan.run_dir} exists; the harness needs a fresh directory")
    plan.run_dir.mkdir(parents=True)
    report = ChaosReport(plan=plan, config=config)
    started = time.perf_counter()
    overrides = run_overrides(plan)
    delays: list[float | None] = [*kill_delays(plan.seed, plan.kills, plan.kill_window_s), None]
    with open(plan.run_dir / CHILD_OUTPUT_FILENAME, "ab") as output:
        for number, delay in enumerate(delays, start=1):
            record = _one_start(plan, config, overrides, number, delay, output)
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
    kill_delay: float | None,
    output: IO[bytes],
) -> StartRecord:
    incarnation_path = Path(config.logging.log_dir) / INCARNATION_FILENAME
    before = _read_incarnation(incarnation_path)
    output.write(f"\n=== start {number} (kill delay {kill_delay}) ===\n".encode())
    output.flush()
    spawned = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
        child_command(plan.config_path, overrides),
        stdout=output,
        stderr=subprocess.STDOUT,
        cwd=plan.run_dir,
    )
    try:
        outcome = _supervise(child, plan, incarnation_path, before, kill_delay)
    finally:
        _kill_if_running(child)
    return StartRecord(
        number=number,
        outcome=outcome,
        exit_code=child.returncode,
        seconds=time.perf_counter() - spawned,
        kill_delay_s=kill_delay,
    )


def _supervise(
    child: subprocess.Popen[bytes],
    plan: ChaosPlan,
    incarnation_path: Path,
    before: int,
    kill_delay: float | None,
) -> StartOutcome:
    deadline = time.monotonic() + plan.start_timeout_s
    started = kill_delay is not None and _wait_for_start(child, incarnation_path, before, deadline)
    if started and kill_delay is not None and _exited_within(child, kill_delay) is None:
        _kill_if_running(child)
        return StartOutcome.KILLED
    exit_code = _exited_within(child, max(0.0, deadline - time.monotonic()))
    if exit_code is None:
        return StartOutcome.TIMED_OUT
    return StartOutcome.FINISHED if exit_code == 0 else StartOutcome.FAILED


def _wait_for_start(
    child: subprocess.Popen[bytes], incarnation_path: Path, before: int, deadline: float
) -> bool:
    """Whether the child counted its incarnation (False: it exited or timed out first)."""
    while time.monotonic() < deadline:
        if _read_incarnation(incarnation_path) > before:
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
            "ended; lengthen the run (e.g. more dataset.num_prompts) or shorten --kill-window"
        )
    return problems
