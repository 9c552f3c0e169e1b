"""``rollvault run``: the recipe (:mod:`rollvault.recipes.async_grpo`) with progress and a report.

Live progress shows the step, reward, accuracy, rollout tokens/s, groups in
flight, buffered groups and the age of the newest snapshot;
``<log_dir>/metrics.jsonl`` gets one line per step. At the end: a one-screen
summary and ``<log_dir>/reward_accuracy.png`` with the restores marked.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollvault.cli.metrics_log import METRICS_LOG_FILENAME, read_metrics
from rollvault.cli.run_report import PLOT_FILENAME, plot_run, summary_lines
from rollvault.cli.step_monitor import StepMonitor
from rollvault.config.errors import ConfigError
from rollvault.config.schema import RunConfig, TrainerKind
from rollvault.controller.loop.io_failures import RunStoppedByIOError
from rollvault.controller.loop.pipeline import RunSummary
from rollvault.controller.loop.run_logs import RESTORES_LOG_FILENAME, RestoreLogRecord, read_jsonl
from rollvault.controller.snapshots.restorer import RestoreError
from rollvault.controller.snapshots.resume import RunExistsError
from rollvault.durable.errors import IncompatibleRunError, NoUsableSnapshotError
from rollvault.gates.causal_lm import ModelDirError
from rollvault.recipes.async_grpo import PreparedRun, prepare, train

IO_STOP_EXIT_STATUS = 3
"""The run stopped on writes it could not make (disk full, I/O error); see the README."""


def run_command(config: RunConfig) -> int:
    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        prepared = _prepare(config, console)
        summary, steps = asyncio.run(_train(prepared, console))
    except (
        ConfigError,
        IncompatibleRunError,
        RunExistsError,
        NoUsableSnapshotError,
        RestoreError,
        ModelDirError,
    ) as error:
        console.print(f"rollvault run: cannot start: {error}", markup=False, highlight=False)
        return 2
    except RunStoppedByIOError as error:
        console.print(f"rollvault run: cannot continue: {error}", markup=False, highlight=False)
        return IO_STOP_EXIT_STATUS
    _report(console, prepared, summary, steps, time.perf_counter() - started)
    return 0


def _prepare(config: RunConfig, console: Console) -> PreparedRun:
    if config.trainer.warmup.steps and config.trainer.kind is TrainerKind.GRPO:
        console.print(
            f"preparing the policy ({config.model.path}); warm-up of up to "
            f"{config.trainer.warmup.steps} supervised steps unless resuming a trainer checkpoint",
            markup=False,
            highlight=False,
        )
    return prepare(config)


async def _train(prepared: PreparedRun, console: Console) -> tuple[RunSummary, int]:
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
    try:
        with progress:
            summary = await train(prepared, on_step=monitor.on_step)
    finally:
        monitor.close()
    return summary, monitor.steps


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
    console.print(
        f"  logs: {log_dir / METRICS_LOG_FILENAME}" + (f", plot: {plot}" if plot else ""),
        markup=False,
        highlight=False,
    )
