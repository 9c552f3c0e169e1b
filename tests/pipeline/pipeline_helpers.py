"""Run the pipeline in-process with the simulated gate, and read its evidence."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from rollvault.controller.config import RunConfig, load_run_config
from rollvault.controller.pipeline import RunSummary, build_parts, run_pipeline
from rollvault.controller.replay_index import ReplayEntry
from rollvault.controller.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    DROPS_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    AttemptLogRecord,
    DropLogRecord,
    TrainLogRecord,
    read_jsonl,
)
from rollvault.controller.trainer import RecordingTrainer, TrainBatch
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.environment import ParityEnvironment
from rollvault.gates.simulated import SimulatedGate


class BatchKeepingTrainer(RecordingTrainer):
    """Also keeps each batch's replay entries, to check staleness."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[int, ReplayEntry]] = []

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self.entries.extend((batch.step, entry) for entry in batch.groups)
        return await super().train_step(batch)


def small_config(tmp_path: Path, *overrides: str) -> RunConfig:
    base = [
        "dataset.num_prompts=24",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_epochs=2",
        "grpo.max_num_steps=1000",
        "rollout.max_inflight_prompts=6",
        "rollout.max_buffered_rollouts=8",
        "gate.simulated.median_response_tokens=8",
        "gate.simulated.max_response_tokens=64",
        "reward.max_response_tokens=48",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
    ]
    return load_run_config(None, [*base, *overrides])


def run_simulated(config: RunConfig) -> tuple[RunSummary, BatchKeepingTrainer]:
    trainer = BatchKeepingTrainer()

    async def main() -> RunSummary:
        parts = build_parts(config)

        def gate(data_plane: DataPlane) -> SimulatedGate:
            return SimulatedGate(config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed)

        return await run_pipeline(parts, gate_factory=gate, trainer=trainer)

    return asyncio.run(main()), trainer


def logs(config: RunConfig) -> tuple[list[TrainLogRecord], list[DropLogRecord], list[AttemptLogRecord]]:
    log_dir = Path(config.logging.log_dir)
    return (
        read_jsonl(log_dir / TRAIN_LOG_FILENAME, TrainLogRecord),
        read_jsonl(log_dir / DROPS_LOG_FILENAME, DropLogRecord),
        read_jsonl(log_dir / ATTEMPTS_LOG_FILENAME, AttemptLogRecord),
    )


def prompt_outcomes(config: RunConfig) -> Counter[tuple[int, str]]:
    """(epoch, sample id) -> how many times it was trained or dropped."""
    trained, dropped, _ = logs(config)
    counts: Counter[tuple[int, str]] = Counter()
    for record in trained:
        counts[(record.epoch, record.sample_id)] += 1
    for drop in dropped:
        counts[(drop.epoch, drop.sample_id)] += 1
    return counts
