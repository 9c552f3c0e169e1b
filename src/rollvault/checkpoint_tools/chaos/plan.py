"""The harness's plan: the run config every start uses, and the seeded kill schedule.

A kill comes either a seeded delay after its start (``kill_window_s``, the
default) or after a seeded number of train steps the start made
(``kill_after_steps``), never both: the timer depends on the machine's speed,
the step count does not.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from rollvault.checkpoint_tools.run_history import PromptKey
from rollvault.config.loading import load_run_config
from rollvault.config.overrides import parse_override
from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.tasks.registry import build_dataset

CHAOS_OVERRIDES: Final = (
    "dataset.num_prompts=48",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_epochs=2",
    "grpo.max_num_steps=1000000",
    "rollout.max_inflight_prompts=6",
    "rollout.max_buffered_rollouts=8",
    "gate.simulated.median_response_tokens=8",
    "gate.simulated.max_response_tokens=64",
    "gate.simulated.latency_per_token_s=0.01",
    "reward.max_response_tokens=48",
    "rollout_checkpointing.interval_s=0.2",
    "checkpointing.save_period=4",
)
"""The harness's run: several seconds long, snapshots every 0.2 s, a trainer
checkpoint every 4 steps, and an end by data exhaustion (2 epochs of 48 prompts).
User overrides come after these and win."""

HARNESS_OWNED_PATHS: Final = frozenset(
    {
        "logging.log_dir",
        "logging.progress",
        "checkpointing.checkpoint_dir",
        "rollout_checkpointing.restore_mode",
    }
)
"""Set by the harness for every start; an override of them is refused."""


DEFAULT_KILL_WINDOW_S: Final = 1.0
"""The timer schedule's window when no schedule is chosen (the CLI's default too)."""


class ChaosUsageError(ValueError):
    """The harness cannot run as asked (bad override, existing directory, endless run)."""


@dataclass(frozen=True)
class ChaosPlan:
    """One harness run: where, how many kills, and when."""

    run_dir: Path
    """Holds the run's ``logs/``, ``checkpoints/`` and the children's output; must not exist."""
    kills: int
    seed: int = 0
    restore_mode: RestoreMode = RestoreMode.LATEST
    overrides: tuple[str, ...] = ()
    config_path: Path | None = None
    """The run config file every start uses (None: the packaged default, simulated gate)."""
    kill_window_s: float | None = DEFAULT_KILL_WINDOW_S
    """Each kill comes a uniform random delay in [0, kill_window_s) after its start.
    None: the kills come by ``kill_after_steps`` instead."""
    kill_after_steps: tuple[int, int] | None = None
    """(lo, hi): each kill comes once the start logged a uniform random number of train
    steps in [lo, hi] (0: as soon as the start is detected). Exclusive with
    ``kill_window_s``, which must then be None."""
    start_timeout_s: float = 120.0
    """A start that neither starts nor ends within this is killed and reported."""


def kill_delays(seed: int, kills: int, window_s: float) -> list[float]:
    """The seeded kill schedule: one delay per kill, in seconds after each start."""
    rng = random.Random(seed)
    return [rng.uniform(0.0, window_s) for _ in range(kills)]


def kill_step_counts(seed: int, kills: int, steps: tuple[int, int]) -> list[int]:
    """The seeded progress schedule: per kill, the train steps its start makes first.

    Each count is uniform in ``[lo, hi]``, both ends included.
    """
    rng = random.Random(seed)
    lo, hi = steps
    return [rng.randint(lo, hi) for _ in range(kills)]


@dataclass(frozen=True)
class TimerKill:
    """Kill a start this many seconds after it was detected."""

    delay_s: float


@dataclass(frozen=True)
class StepsKill:
    """Kill a start once it logged this many train steps of its own."""

    steps: int


KillPoint = TimerKill | StepsKill
"""When one start is killed."""


def kill_schedule(plan: ChaosPlan) -> list[KillPoint]:
    """One kill point per planned kill, from whichever schedule the plan sets."""
    _check_schedule(plan)
    if plan.kill_after_steps is not None:
        counts = kill_step_counts(plan.seed, plan.kills, plan.kill_after_steps)
        return [StepsKill(count) for count in counts]
    assert plan.kill_window_s is not None  # _check_schedule: exactly one is set
    return [TimerKill(delay) for delay in kill_delays(plan.seed, plan.kills, plan.kill_window_s)]


def _check_schedule(plan: ChaosPlan) -> None:
    """Exactly one usable schedule; raises :class:`ChaosUsageError` naming the fields."""
    window, steps = plan.kill_window_s, plan.kill_after_steps
    if window is not None and steps is not None:
        raise ChaosUsageError(
            f"kill_window_s ({window}) and kill_after_steps ({steps}) are exclusive: "
            "set kill_window_s=None to kill by train steps"
        )
    if window is None and steps is None:
        raise ChaosUsageError(
            "neither kill_window_s nor kill_after_steps is set: one of them must schedule the kills"
        )
    if window is not None and not window > 0:  # not > 0: NaN is refused too
        raise ChaosUsageError(f"kill_window_s ({window}) must be > 0")
    if steps is not None and not _usable_step_range(steps):
        raise ChaosUsageError(
            f"kill_after_steps ({steps}) must be two integers (lo, hi) with 0 <= lo <= hi"
        )


def _usable_step_range(steps: tuple[int, int]) -> bool:
    # The plan may be built from untyped input; bool is an int but no step count.
    if len(steps) != 2 or not all(type(n) is int for n in steps):
        return False
    lo, hi = steps
    return 0 <= lo <= hi


def chaos_config(plan: ChaosPlan) -> RunConfig:
    """The run config every start uses; raises :class:`ChaosUsageError` if unusable."""
    owned = sorted(
        path
        for path in (parse_override(o)[0] for o in plan.overrides)
        if path in HARNESS_OWNED_PATHS
    )
    if owned:
        raise ChaosUsageError(f"the harness sets {owned} itself; do not override them")
    if plan.kills < 0 or not plan.start_timeout_s > 0:
        raise ChaosUsageError(
            f"kills ({plan.kills}) must be >= 0 and start_timeout_s ({plan.start_timeout_s}) > 0"
        )
    _check_schedule(plan)
    config = _resolved_in_run_dir(load_run_config(plan.config_path, run_overrides(plan)), plan)
    total = num_prompts(config) * config.grpo.max_num_epochs
    if config.grpo.max_num_steps < total:
        raise ChaosUsageError(
            f"grpo.max_num_steps ({config.grpo.max_num_steps}) must be at least the number of "
            f"prompts over all epochs ({total}), so that the run ends by data exhaustion and "
            "every prompt must be accounted for"
        )
    return config


def _resolved_in_run_dir(config: RunConfig, plan: ChaosPlan) -> RunConfig:
    """``config`` with a relative ``model.path`` made absolute under the run dir.

    The children run with the run dir as their cwd; the harness's own checks
    (which compute the run's identity, model file digests included) run
    elsewhere and must see the same model directory.
    """
    model_path = Path(config.model.path)
    if model_path.is_absolute():
        return config
    model = msgspec.structs.replace(config.model, path=str(plan.run_dir.resolve() / model_path))
    return msgspec.structs.replace(config, model=model)


def run_overrides(plan: ChaosPlan) -> list[str]:
    """The overrides every start passes to ``rollvault run``, the harness's own last."""
    run_dir = plan.run_dir.resolve()  # children run with the run dir as cwd
    return [
        *CHAOS_OVERRIDES,
        *plan.overrides,
        f"logging.log_dir={run_dir / 'logs'}",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        "logging.progress=false",
        f"rollout_checkpointing.restore_mode={plan.restore_mode.value}",
    ]


def num_prompts(config: RunConfig) -> int:
    """Prompts per epoch of the run: the length of its task's dataset.

    Raises :class:`~rollvault.tasks.registry.UnknownTaskError` (a ``ConfigError``)
    when ``dataset.kind`` names no task, before any child starts.
    """
    return len(
        build_dataset(config.dataset, vocab_size=config.gate.simulated.vocab_size, seed=config.seed)
    )


def expected_prompts(config: RunConfig) -> set[PromptKey]:
    """Every (epoch, sample id) a run that ends by data exhaustion must account for."""
    return {
        (epoch, str(idx))
        for epoch in range(config.grpo.max_num_epochs)
        for idx in range(num_prompts(config))
    }


def child_command(config_path: Path | None, config_overrides: Sequence[str]) -> list[str]:
    """The command line of one start: this interpreter running ``rollvault run``."""
    # Children run with the run dir as cwd, so a relative config path is resolved here.
    config = ["--config", str(config_path.resolve())] if config_path is not None else []
    return [sys.executable, "-m", "rollvault.cli.main", "run", *config, *config_overrides]
