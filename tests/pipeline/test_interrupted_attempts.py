"""Attempts interrupted by the death of the run: charged across restarts, dropped after the budget.

In-process and deterministic: the gate raises something that is not a
``GateAttemptError`` for one dataset index, which takes the whole run down
(the real-process version, SIGKILL and all, is in tests/chaos). Each start
restores, charges the attempt that was in flight, and runs again; after
``max_interrupted_retries + 1`` crashes the prompt is given up and the run
ends. An innocent prompt whose attempt is in flight at more external kills
than the infra budget allows is kept and trained. And the groups a death
interrupted run their next round alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from pipeline_helpers import (
    BatchKeepingTrainer,
    dataset_of,
    expected_prompts,
    logs,
    run_stalled_then_kill,
    small_config,
)

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    effective_drops,
    read_run_history,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.data.dataloader import epoch_permutation
from rollvault.controller.loop.dispatch_journal import (
    DISPATCH_JOURNAL_DIRNAME,
    DispatchedLine,
    ReturnedLine,
    journal_segments,
    read_segment,
)
from rollvault.controller.loop.gate import AttemptOutcome, AttemptRequest
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.synthetic.environment import ParityEnvironment

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
        return asyncio.run(
            run(
                config, gate_factory=gate, trainer=BatchKeepingTrainer(), dataset=dataset_of(config)
            )
        )
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
        # Below the default, to keep the test short; the bound is the same rule.
        "rollout.max_interrupted_retries=3",
    )
    crashes = 0
    summary = None
    while summary is None and crashes <= 10:
        summary = run_once(config, poison)
        crashes += summary is None
    assert summary is not None, "the run crash-looped"
    assert crashes == config.rollout.max_interrupted_retries + 1
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


class OverlapRecordingGate(SimulatedGate):
    """Records, at each attempt's start, the other groups with an attempt running."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.running: Counter[str] = Counter()
        self.starts: list[tuple[str, set[str]]] = []

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        others = {g for g, n in self.running.items() if n and g != request.group_id}
        self.starts.append((request.group_id, others))
        self.running[request.group_id] += 1
        try:
            return await super().run_attempt(request)
        finally:
            self.running[request.group_id] -= 1


def forget_returns(journal_dir: Path) -> None:
    """Leave only the dispatch lines: as if every attempt in flight had died with the process."""
    for _, path in journal_segments(journal_dir):
        kept = [line for line in read_segment(path) if isinstance(line, DispatchedLine)]
        path.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in kept))


def test_groups_a_death_interrupted_run_their_next_round_alone(tmp_path: Path) -> None:
    config = small_config(
        tmp_path,
        "gate.simulated.latency_per_token_s=0.002",
        "rollout_checkpointing.interval_s=0.05",
    )
    # Sibling 3 of every group hangs: the snapshots hold max_inflight_prompts groups
    # with it dispatched. Without its returns, the journal says all six died with it.
    run_stalled_then_kill(config, stalled_index=3)
    forget_returns(Path(config.checkpointing.checkpoint_dir) / DISPATCH_JOURNAL_DIRNAME)
    gates: list[OverlapRecordingGate] = []

    def gate(data_plane: DataPlane) -> SimulatedGate:
        gates.append(
            OverlapRecordingGate(
                config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed
            )
        )
        return gates[0]

    asyncio.run(
        run(config, gate_factory=gate, trainer=BatchKeepingTrainer(), dataset=dataset_of(config))
    )
    history = read_run_history(Path(config.logging.log_dir))
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 2)) == []
    charged = {a.group_id for a in history.attempts if a.incarnation == 2 and a.status == "failed"}
    started = {group_id for group_id, _ in gates[0].starts}
    suspects = charged & started  # restored groups (lost ones come back under new ids)
    assert len(suspects) == config.rollout.max_inflight_prompts
    for group_id, others in gates[0].starts:
        if group_id in suspects:
            assert others == set(), f"suspect {group_id} ran beside {others}"
        else:
            assert not others & suspects, f"{group_id} ran beside suspects {others & suspects}"


class HangOnceGate(SimulatedGate):
    """An attempt of one sibling of one prompt hangs: in flight when the test kills the run."""

    def __init__(
        self,
        *args: object,
        prompt_idx: int,
        hung: list[str],
        hanging: asyncio.Event,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._prompt_idx = prompt_idx
        self._hung = hung
        self.hanging = hanging
        """Set when the attempt starts hanging (the test made it: the gate is built in the run)."""

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        if request.prompt["idx"] == self._prompt_idx and request.generation_index == 3:
            self._hung.append(request.gate_rollout_id)
            self.hanging.set()
            await asyncio.Event().wait()  # never set: hangs until the kill
        return await super().run_attempt(request)


def kill_while_hanging(config: RunConfig, prompt_idx: int, hung: list[str]) -> None:
    """One start, killed from outside while the prompt's attempt is in flight."""
    gates: list[HangOnceGate] = []
    hanging = asyncio.Event()

    def gate(data_plane: DataPlane) -> SimulatedGate:
        gates.append(
            HangOnceGate(
                config.gate.simulated,
                data_plane,
                ParityEnvironment(),
                seed=config.seed,
                prompt_idx=prompt_idx,
                hung=hung,
                hanging=hanging,
            )
        )
        return gates[0]

    async def main() -> None:
        task = asyncio.create_task(
            run(
                config, gate_factory=gate, trainer=BatchKeepingTrainer(), dataset=dataset_of(config)
            )
        )
        hung_now = asyncio.create_task(hanging.wait())
        # Whichever comes first: the attempt hangs, or the run ends (it must not).
        await asyncio.wait({task, hung_now}, timeout=60.0, return_when=asyncio.FIRST_COMPLETED)
        hung_now.cancel()
        assert not task.done(), "the run ended before the prompt's attempt hung (was it dropped?)"
        assert hanging.is_set(), "the prompt's attempt did not hang within 60 s"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # A SIGKILL writes no returns: forget the one the cancellation wrote for it.
    attempt = hung[-1].rsplit("_a", 1)[1]
    for _, path in journal_segments(
        Path(config.checkpointing.checkpoint_dir) / DISPATCH_JOURNAL_DIRNAME
    ):
        kept = [
            line
            for line in read_segment(path)
            if not (isinstance(line, ReturnedLine) and line.attempt_uuid == attempt)
        ]
        path.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in kept))


def test_an_innocent_prompt_in_flight_at_more_kills_than_the_infra_budget_is_kept(
    tmp_path: Path,
) -> None:
    # The first prompt of the epoch: a restart dispatches it first, alone once a
    # suspect, and each kill comes while its attempt runs (issue 16, prompt 42).
    innocent = epoch_permutation(NUM_PROMPTS, seed=0, epoch=0)[0]
    config = small_config(
        tmp_path,
        "grpo.max_num_epochs=1",
        "gate.simulated.latency_per_token_s=0.002",
        "rollout_checkpointing.interval_s=0.05",
    )
    kills = config.rollout.max_sibling_retries + 2
    assert kills <= config.rollout.max_interrupted_retries
    hung: list[str] = []
    for _ in range(kills):
        kill_while_hanging(config, innocent, hung)
    summary = run_once(config, poison_idx=-1)
    assert summary is not None
    history = read_run_history(Path(config.logging.log_dir))
    # Every kill charged the prompt's attempt: the same sibling, `kills` times.
    charged = {a.gate_rollout_id for a in history.attempts if a.status == "failed"}
    assert len(set(hung)) == kills and set(hung) <= charged
    assert effective_drops(history) == []
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 1)) == []
    trained, _, _ = logs(config)
    assert str(innocent) in {record.sample_id for record in trained}
