"""Attempts interrupted by the death of the run: charged across restarts, dropped after the budget.

In-process and deterministic: the gate raises something that is not a
``GateAttemptError`` for one dataset index, which takes the whole run down
(the real-process version, SIGKILL and all, is in tests/chaos). Each start
restores, charges the attempt that was in flight, and runs again; after
``max_sibling_retries + 1`` crashes the prompt is given up and the run ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pipeline_helpers import (
    BatchKeepingTrainer,
    expected_prompts,
    logs,
    small_config,
)

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    effective_drops,
    read_run_history,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.data.dataloader import epoch_permutation
from rollvault.controller.loop.gate import AttemptOutcome, AttemptRequest
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.environment import ParityEnvironment
from rollvault.gates.simulated import SimulatedGate

NUM_PROMPTS = 24


class PoisonCrash(RuntimeError):
    """What the poison prompt's attempt raises: not a gate failure, a crash of the run."""


class PoisonGate(SimulatedGate):
    def __init__(self, *args: object, poison_idx: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._poison_idx = poison_idx

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        if request.prompt["idx"] == self._poison_idx:
            raise PoisonCrash(f"prompt {self._poison_idx} crashes the run")
        return await super().run_attempt(request)


def run_once(config: RunConfig, poison_idx: int) -> RunSummary | None:
    """One start; None when the poison prompt crashed it."""

    def gate(data_plane: DataPlane) -> SimulatedGate:
        return PoisonGate(
            config.gate.simulated,
            data_plane,
            ParityEnvironment(),
            seed=config.seed,
            poison_idx=poison_idx,
        )

    try:
        return asyncio.run(run(config, gate_factory=gate, trainer=BatchKeepingTrainer()))
    except* PoisonCrash as crash:
        # One attempt raised; its siblings were cancelled by the crash, not crashed.
        assert len(crash.exceptions) == 1
    return None


@pytest.mark.parametrize("position", ["first", "middle"])
def test_a_prompt_that_crashes_the_run_is_dropped_after_its_budget(
    tmp_path: Path, position: str
) -> None:
    # The first prompt of the epoch crashes every start before any snapshot exists;
    # a later one after several, so restores find it lost with the process.
    order = epoch_permutation(NUM_PROMPTS, seed=0, epoch=0)
    poison = order[0] if position == "first" else order[NUM_PROMPTS // 2]
    config = small_config(
        tmp_path,
        "grpo.max_num_epochs=1",
        "gate.simulated.latency_per_token_s=0.002",
        "rollout_checkpointing.interval_s=0.05",
        "rollout.on_dropped_prompt=shrink",
    )
    crashes = 0
    summary = None
    while summary is None and crashes <= 10:
        summary = run_once(config, poison)
        crashes += summary is None
    assert summary is not None, "the run crash-looped"
    assert crashes == config.rollout.max_sibling_retries + 1
    history = read_run_history(Path(config.logging.log_dir))
    drops = effective_drops(history)
    assert [(d.epoch, d.sample_id, d.replaced) for d in drops] == [(0, str(poison), False)]
    # Every other prompt trained exactly once; the poison one is in the step's shortfall.
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 1)) == []
    trained, _, _ = logs(config)
    assert str(poison) not in {record.sample_id for record in trained}
    assert summary.shortfall == {drops[0].target_step: 1}
    restores = history.restores
    assert len(restores) == crashes
    assert all(restore.attempts_interrupted >= 1 for restore in restores)
