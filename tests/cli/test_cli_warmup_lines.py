"""What ``rollvault run`` says while the policy warms up (:mod:`rollvault.cli.warmup_lines`)."""

from __future__ import annotations

import pytest

from rollvault.cli.warmup_lines import WarmupLines
from rollvault.training.warmup import WarmupProgress


def _at(steps_done: int, seconds: float, *, steps: int = 100, loss: float = 0.5) -> WarmupProgress:
    return WarmupProgress(
        steps_done=steps_done,
        steps=steps,
        loss=None if steps_done == 0 else loss,
        seconds=seconds,
    )


def test_the_start_is_said_then_one_line_per_period_while_it_runs() -> None:
    said: list[str] = []
    lines = WarmupLines(said.append, period_s=10.0)
    lines(_at(0, 0.0))
    assert said == ["warm-up: started, 100 supervised steps"]
    for steps_done, seconds in [(1, 4.0), (2, 9.9), (3, 10.0), (4, 15.0), (5, 19.9), (6, 20.5)]:
        lines(_at(steps_done, seconds, loss=0.25))
    # At 10.0 s, then not before 20.0 s (10 s after the last line, not after the start).
    assert said[1:] == [
        "warm-up: step 3/100, loss 0.250, 10s",
        "warm-up: step 6/100, loss 0.250, 20s",
    ]


def test_the_last_step_says_nothing_the_policy_line_follows() -> None:
    said: list[str] = []
    lines = WarmupLines(said.append, period_s=1.0)
    lines(_at(0, 0.0, steps=2))
    lines(_at(2, 50.0, steps=2))
    assert said == ["warm-up: started, 2 supervised steps"]


def test_a_period_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="period_s must be > 0, got 0.0"):
        WarmupLines(print, period_s=0.0)
