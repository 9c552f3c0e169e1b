"""``rollvault run``: wire the simulated gate and a trainer into the pipeline."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollvault.controller.config import RunConfig
from rollvault.controller.parts import RolloutParts
from rollvault.controller.pipeline import RunSummary, run
from rollvault.controller.restorer import RestoreError
from rollvault.controller.resume import RunExistsError
from rollvault.dataplane.interface import DataPlane
from rollvault.durable.errors import IncompatibleRunError, NoUsableSnapshotError
from rollvault.gates.environment import ParityEnvironment
from rollvault.gates.simulated import SimulatedGate
from rollvault.training.recording import RecordingTrainer


def run_command(config: RunConfig) -> int:
    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        summary = asyncio.run(_run(config, console))
    except (IncompatibleRunError, RunExistsError, NoUsableSnapshotError, RestoreError) as error:
        console.print(f"rollvault run: cannot start: {error}", markup=False, highlight=False)
        return 2
    elapsed = time.perf_counter() - started
    _print_summary(console, config, summary, elapsed)
    return 0


async def _run(config: RunConfig, console: Console) -> RunSummary:

    def simulated_gate(data_plane: DataPlane) -> SimulatedGate:
        return SimulatedGate(
            config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed
        )

    progress = Progress(
        TextColumn("[bold]step"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        disable=not config.logging.progress,
    )
    task = progress.add_task("", total=config.grpo.max_num_steps)

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        progress.update(task, completed=parts.trainer_version, description=_status(parts))

    with progress:
        return await run(
            config, gate_factory=simulated_gate, trainer=RecordingTrainer(), on_step=on_step
        )


def _status(parts: RolloutParts) -> str:
    return (
        f"in flight {len(parts.ledger):3d}  buffered {len(parts.replay):3d}  "
        f"lost {parts.shortfall.total_lost}"
    )


def _print_summary(
    console: Console, config: RunConfig, summary: RunSummary, elapsed: float
) -> None:
    console.print(
        f"rollvault run (incarnation {summary.incarnation}): "
        f"{summary.trainer_version} steps, {summary.trained_groups} groups trained, "
        f"{summary.dropped_groups} dropped, failures infra={summary.infra_failures} "
        f"data={summary.data_failures}, in {elapsed:.1f}s"
    )
    console.print(
        f"checkpoints: {config.checkpointing.checkpoint_dir} ({summary.snapshots_written} "
        f"rollout snapshots, {summary.trainer_checkpoints} trainer checkpoints this start); "
        f"logs: {config.logging.log_dir}"
    )
