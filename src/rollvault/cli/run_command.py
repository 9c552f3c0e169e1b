"""``rollvault run``: the recipe (:mod:`rollvault.recipes.async_grpo`) with progress and a report.

Live progress shows the step, reward, accuracy, rollout tokens/s, groups in
flight, buffered groups and the age of the newest snapshot;
``<log_dir>/metrics.jsonl`` gets one line per step. At the end: a one-screen
summary and ``<log_dir>/reward_accuracy.png`` with the restores marked.

SIGTERM or SIGINT stops the run in order (:mod:`rollvault.cli.preemption`):
a final rollout snapshot, a line saying where a restart resumes, exit code
143 or 130.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollvault.cli.metrics_log import METRICS_LOG_FILENAME, read_metrics
from rollvault.cli.preemption import (
    Preempted,
    exit_code,
    exit_now,
    raise_on_signals,
    stop_message,
    stop_on_signals,
)
from rollvault.cli.run_report import PLOT_FILENAME, plot_run, policy_line, summary_lines
from rollvault.cli.step_monitor import StepMonitor
from rollvault.cli.warmup_lines import WarmupLines
from rollvault.config.errors import ConfigError
from rollvault.config.schema import RunConfig, TrainerKind
from rollvault.controller.loop.io_failures import RunStoppedByIOError
from rollvault.controller.loop.pipeline import RunSummary
from rollvault.controller.loop.run_logs import RESTORES_LOG_FILENAME, RestoreLogRecord, read_jsonl
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.controller.loop.trainer import TrainerLostError
from rollvault.controller.snapshots.restorer import RestoreError
from rollvault.controller.snapshots.resume import RunExistsError
from rollvault.dataplane.errors import DataPlaneStartError
from rollvault.durable.errors import (
    IncompatibleRunError,
    NoUsableSnapshotError,
    SnapshotManifestError,
)
from rollvault.durable.run_lock import RunLockedError, acquire_run_lock
from rollvault.gates.errors import ModelDirError
from rollvault.recipes.async_grpo import PreparedRun, prepare, train, version_zero_policy_path
from rollvault.recipes.ray_runtime import ray_runtime


@dataclass(frozen=True)
class _Trained:
    summary: RunSummary
    steps: int
    """Steps trained by this start."""
    signal: signal.Signals | None
    """The signal that asked the run to stop, if one came (even after the last step)."""


IO_STOP_EXIT_STATUS = 3
"""The run stopped on writes it could not make (disk full, I/O error); see the README."""

TRAINER_LOST_EXIT_STATUS = 4
"""The trainer's Ray actor or process died (trainer.placement: ray or process); a restart
resumes the run."""


def run_command(config: RunConfig) -> int:
    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        with raise_on_signals():
            try:
                # One process owns a checkpoint directory for the whole run: from
                # the policy's warm-up and saves to the last snapshot (invariant 9).
                with (
                    acquire_run_lock(Path(config.checkpointing.checkpoint_dir)),
                    # A private Ray (ray.address: local) lives as long as the run; a
                    # killed start's leftovers are cleared first, under the lock.
                    ray_runtime(config),
                ):
                    prepared = _prepare(config, console)
                    # The trainer process (if any) ends with the run, under the lock.
                    with prepared:
                        trained = asyncio.run(_train(prepared, console))
            except (
                RunLockedError,
                ConfigError,
                IncompatibleRunError,
                RunExistsError,
                NoUsableSnapshotError,
                RestoreError,
                ModelDirError,
                SnapshotManifestError,  # a damaged anchor file: named, never overwritten
                DataPlaneStartError,  # TransferQueue (or Ray) did not start, or is not installed
            ) as error:
                _say(console, f"rollvault run: cannot start: {error}")
                return 2
            except RunStoppedByIOError as error:
                _say(console, f"rollvault run: cannot continue: {error}")
                return IO_STOP_EXIT_STATUS
            except TrainerLostError as error:
                _say(console, f"rollvault run: cannot continue: {error}")
                return TRAINER_LOST_EXIT_STATUS
            if trained.summary.shutdown is not None:
                grace_s = config.rollout_checkpointing.shutdown_grace_s
                _say(console, stop_message(trained.summary.shutdown, grace_s=grace_s))
            else:
                elapsed = time.perf_counter() - started
                _report(console, prepared, trained.summary, trained.steps, elapsed)
    except Preempted as stop:
        # Loading, warm-up or the report: the checkpoint directory is not being written.
        _say(console, f"rollvault run: {stop.signum.name} while not training: exiting")
        return exit_code(stop.signum)
    return 0 if trained.signal is None else exit_code(trained.signal)


def _say(console: Console, line: str) -> None:
    # Never wrapped: a path split across lines could not be copied or grepped.
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _prepare(config: RunConfig, console: Console) -> PreparedRun:
    if config.trainer.warmup.steps and config.trainer.kind is TrainerKind.GRPO:
        console.print(
            f"preparing the policy ({config.model.path}); warm-up of up to "
            f"{config.trainer.warmup.steps} supervised steps unless resuming a trainer checkpoint "
            "or the saved version-0 policy",
            markup=False,
            highlight=False,
        )
    prepared = prepare(config, on_warmup=WarmupLines(lambda line: _say(console, line)))
    if prepared.policy is not None:
        line = policy_line(
            prepared.policy.start,
            warmup=prepared.warmup,
            version_zero=version_zero_policy_path(config),
        )
        if line is not None:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    return prepared


async def _train(prepared: PreparedRun, console: Console) -> _Trained:
    config = prepared.config
    progress = Progress(
        TextColumn("[bold]step"),
        BarColumn(bar_width=16),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        disable=not config.logging.progress,
    )
    task = progress.add_task("starting", total=config.grpo.max_num_steps)

    def show(version: int, status: str) -> None:
        progress.update(task, completed=version, description=status)

    monitor = StepMonitor(config, prepared.tokens_generated, on_status=show)
    if monitor.tensorboard is not None and monitor.tensorboard.unavailable_reason:
        console.print(
            f"logging.tensorboard: skipped, {monitor.tensorboard.unavailable_reason}",
            markup=False,
            highlight=False,
        )
    shutdown = Shutdown()
    grace_s = config.rollout_checkpointing.shutdown_grace_s
    try:
        with (
            progress,
            stop_on_signals(shutdown, grace_s=grace_s, announce=lambda line: _say(console, line)),
        ):
            summary = await train(prepared, on_step=monitor.on_step, shutdown=shutdown)
    finally:
        monitor.close()
    stopped = summary.shutdown
    if stopped is not None and stopped.grace_exceeded:
        # Threads may still be writing a snapshot or training a step: leaving
        # asyncio.run would wait for them, past the scheduler's SIGKILL.
        _say(console, stop_message(stopped, grace_s=grace_s))
        assert shutdown.signal is not None
        exit_now(exit_code(shutdown.signal))
    return _Trained(summary=summary, steps=monitor.steps, signal=shutdown.signal)


def _report(
    console: Console, prepared: PreparedRun, summary: RunSummary, steps: int, elapsed: float
) -> None:
    config = prepared.config
    log_dir = Path(config.logging.log_dir)
    metrics = read_metrics(log_dir / METRICS_LOG_FILENAME)
    restores = read_jsonl(log_dir / RESTORES_LOG_FILENAME, RestoreLogRecord)
    for line in summary_lines(
        summary,
        elapsed_s=elapsed,
        metrics=metrics,
        restores=restores,
        warmup=prepared.warmup,
        this_start_steps=steps,
    ):
        console.print(line, markup=False, highlight=False)
    plot = plot_run(metrics, restores, log_dir / PLOT_FILENAME)
    console.print(
        f"  checkpoints: {config.checkpointing.checkpoint_dir} ({summary.snapshots_written} "
        f"rollout snapshots, {summary.trainer_checkpoints} trainer checkpoints this start)",
        markup=False,
        highlight=False,
    )
    if prepared.final_model is not None:
        console.print(
            f"  final model: {prepared.final_model} (a Hugging Face model directory)",
            markup=False,
            highlight=False,
            soft_wrap=True,  # a path to copy, not to wrap
        )
    console.print(
        f"  logs: {log_dir / METRICS_LOG_FILENAME}" + (f", plot: {plot}" if plot else ""),
        markup=False,
        highlight=False,
    )
