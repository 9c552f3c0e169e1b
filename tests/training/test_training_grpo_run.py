"""The real pipeline with the local model gate and the GRPO trainer, in-process.

The learning test runs a fixed number of steps with a fixed seed and no
warm-up: what a freshly initialised model can learn in 60 small steps is the
format reward (answer with digits, then end the sequence), so the test
checks that the mean reward of the last 20 steps clearly beats the first 20.
The accuracy gains of the full recipe need the warm-up and minutes of
training; the benchmark script reports them (``benchmarks/bench_grpo_run.py``).

The crash test kills the run in-process (the trainer raises after a step,
as the chaos harness's SIGKILL would stop it), starts it again, and checks
exactly-once training and sibling reuse on the run's effective history.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import numpy as np
import pytest
from grpo_test_helpers import grpo_config

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    check_sibling_reuse,
    read_run_history,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import GateFactory, RunSummary, run
from rollvault.controller.loop.trainer import TrainBatch, Trainer
from rollvault.recipes.async_grpo import prepare
from rollvault.tasks.protocols import PromptDataset

pytestmark = pytest.mark.slow


def test_a_fixed_seed_run_raises_the_mean_reward(tmp_path: Path) -> None:
    config = grpo_config(
        tmp_path,
        tmp_path / "model",
        "seed=0",
        "dataset.num_prompts=2000",
        "grpo.num_prompts_per_step=8",
        "grpo.num_generations_per_prompt=8",
        "grpo.max_num_steps=60",
        "rollout.max_inflight_prompts=16",
        "rollout.max_buffered_rollouts=24",
        "trainer.learning_rate=1e-3",
        "trainer.warmup.steps=0",
    )
    rewards: list[float] = []

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        rewards.append(metrics["reward_mean"])

    with prepare(config) as setup:
        summary = asyncio.run(setup.run_pipeline(on_step=on_step))
    assert summary.trainer_version == 60 and len(rewards) == 60
    first, last = float(np.mean(rewards[:20])), float(np.mean(rewards[-20:]))
    assert last > first + 0.03 and last > 2 * first, (first, last)


class _Crash(RuntimeError):
    pass


class _CrashAfter:
    """The GRPO trainer, dying right after ``step``: the run stops there, like a kill."""

    def __init__(self, inner: Trainer, step: int) -> None:
        self._inner = inner
        self._step = step

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        metrics = await self._inner.train_step(batch)
        if batch.step == self._step:
            raise _Crash(f"crash after step {batch.step}")
        return metrics

    def save_checkpoint(self, directory: Path) -> None:
        self._inner.save_checkpoint(directory)

    def load_checkpoint(self, directory: Path) -> None:
        self._inner.load_checkpoint(directory)


STALL_S = 40.0
"""No step for this long means the run waits forever (a step here takes well under a second)."""


async def _watched(
    config: RunConfig, trainer: Trainer, gate_factory: GateFactory, dataset: PromptDataset
) -> RunSummary:
    """Run the pipeline; fail with TimeoutError instead of hanging when it stops stepping."""
    last_step = [time.monotonic()]

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        last_step[0] = time.monotonic()

    task = asyncio.create_task(
        run(config, gate_factory=gate_factory, trainer=trainer, dataset=dataset, on_step=on_step)
    )
    while not task.done():
        # A hang guard, not a timing assertion: polled, generous, and it only turns a
        # wait-forever into a failure.
        await asyncio.wait({task}, timeout=2.0)
        if not task.done() and time.monotonic() - last_step[0] > STALL_S:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise TimeoutError(f"no training step for {STALL_S:.0f}s")
    return task.result()


def _start(config: RunConfig, crash_after: int | None) -> RunSummary | None:
    with prepare(config) as setup:
        trainer = setup.trainer if crash_after is None else _CrashAfter(setup.trainer, crash_after)
        summary = None
        try:
            summary = asyncio.run(_watched(config, trainer, setup.gate_factory, setup.dataset))
        except* _Crash:
            pass  # the crash this start was told to have
    return summary


def test_a_crashed_run_resumes_and_trains_every_prompt_exactly_once(tmp_path: Path) -> None:
    steps, per_step = 12, 4
    config = grpo_config(
        tmp_path,
        tmp_path / "model",
        f"dataset.num_prompts={steps * per_step}",
        f"grpo.num_prompts_per_step={per_step}",
        "grpo.num_generations_per_prompt=4",
        f"grpo.max_num_steps={steps}",
        "grpo.max_num_epochs=1",
        "rollout.max_inflight_prompts=8",
        "rollout.max_buffered_rollouts=8",
        "trainer.warmup.steps=0",
        "checkpointing.save_period=4",
        "rollout_checkpointing.interval_s=0.2",
    )
    assert _start(config, crash_after=6) is None
    summary = _start(config, crash_after=None)
    assert summary is not None and summary.trainer_version == steps
    history = read_run_history(Path(config.logging.log_dir))
    assert [r.incarnation for r in history.restores] == [2]
    assert history.restores[0].snapshot is not None
    expected = {(0, str(idx)) for idx in range(steps * per_step)}
    assert check_exactly_once(history, expected) == []
    assert check_sibling_reuse(history) == []
