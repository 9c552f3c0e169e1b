"""A poison prompt, for real: its attempt SIGKILLs ``rollvault run``, start after start.

The harness's run (its config, child command and checks) with the simulated
gate told to kill its own process when an attempt of one dataset index
starts. Nothing kills the child from outside; it is restarted after each of
its deaths. Before retry budgets survived restarts this crash-looped for
ever: the prompt was re-minted on restore and dispatched first. Now each
death charges the attempts that were in flight (the dispatch journal says
which), the suspects run alone afterwards, and after ``max_interrupted_retries
+ 1`` deaths the prompt is dropped and the run finishes.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from rollvault.checkpoint_tools.chaos.checks import check_finished_run
from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    chaos_config,
    child_command,
    run_overrides,
)
from rollvault.checkpoint_tools.chaos.supervisor import CHILD_OUTPUT_FILENAME
from rollvault.checkpoint_tools.run_history import effective_drops
from rollvault.controller.data.dataloader import epoch_permutation
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir

MAX_STARTS = 12


@pytest.mark.slow
def test_a_prompt_that_kills_its_process_is_dropped_after_its_budget(tmp_path: Path) -> None:
    # A prompt from the middle of the epoch: runs restore from snapshots, and the
    # prompts around it are in flight with it when it kills the process.
    poison = epoch_permutation(48, seed=0, epoch=0)[20]
    plan = ChaosPlan(
        run_dir=tmp_path / "poison",
        kills=0,
        overrides=(
            f"gate.simulated.crash_on_prompt_idx={poison}",
            "grpo.max_num_epochs=1",
            "rollout.on_dropped_prompt=shrink",
            # Below the default, to keep the starts few; the bound is the same rule.
            "rollout.max_interrupted_retries=3",
        ),
    )
    config = chaos_config(plan)
    assert config.dataset.num_prompts == 48
    plan.run_dir.mkdir(parents=True)
    exit_codes: list[int] = []
    with open(plan.run_dir / CHILD_OUTPUT_FILENAME, "ab") as output:
        while len(exit_codes) < MAX_STARTS and (not exit_codes or exit_codes[-1] != 0):
            child = subprocess.run(  # noqa: S603 - our own interpreter and arguments
                child_command(None, run_overrides(plan)),
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=plan.run_dir,
                timeout=plan.start_timeout_s,
                check=False,
            )
            exit_codes.append(child.returncode)
    deaths = config.rollout.max_interrupted_retries + 1
    assert exit_codes == [-signal.SIGKILL] * deaths + [0], (
        f"see {plan.run_dir / CHILD_OUTPUT_FILENAME}"
    )
    check = check_finished_run(config)
    # Every other prompt trained exactly once, nothing trained twice, no orphan rows.
    assert check.problems == []
    history = check.history
    ((drop),) = effective_drops(history)
    assert (drop.epoch, drop.sample_id, drop.replaced) == (0, str(poison), False)
    assert str(poison) not in {r.sample_id for records in history.steps.values() for r in records}
    assert check.final_snapshot is not None
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    assert source.snapshot.recovery.batch_shortfall == {drop.target_step: 1}
    restores = history.restores
    assert len(restores) == deaths
    # Each death interrupted at least the poison prompt's four attempts.
    assert all(r.attempts_interrupted >= config.grpo.num_generations_per_prompt for r in restores)
