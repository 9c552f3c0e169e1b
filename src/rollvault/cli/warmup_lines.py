"""What ``rollvault run`` says while the policy warms up: that it started, then where it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Only a type: rollvault.training.warmup imports torch, which a simulated run never needs.
    from rollvault.training.warmup import WarmupProgress

__all__ = ["WARMUP_LINE_PERIOD_S", "WarmupLines"]

WARMUP_LINE_PERIOD_S = 10.0
"""Seconds between two progress lines of a running warm-up."""


class WarmupLines:
    """A :data:`~rollvault.training.warmup.WarmupObserver` that says what the warm-up does.

    One line as it starts, then one every ``period_s`` seconds while it runs: a warm-up
    of thousands of steps is otherwise minutes of silence. A warm-up shorter than
    ``period_s`` says only that it started; the policy line after it gives the result.
    """

    def __init__(
        self, say: Callable[[str], None], *, period_s: float = WARMUP_LINE_PERIOD_S
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"WarmupLines: period_s must be > 0, got {period_s!r}")
        self._say = say
        self._period_s = period_s
        self._next_line_s = period_s

    def __call__(self, progress: WarmupProgress) -> None:
        if progress.steps_done == 0:
            self._say(f"warm-up: started, {progress.steps} supervised steps")
            return
        running = progress.steps_done < progress.steps  # the last step: the policy line follows
        if running and progress.loss is not None and progress.seconds >= self._next_line_s:
            self._say(
                f"warm-up: step {progress.steps_done}/{progress.steps}, "
                f"loss {progress.loss:.3f}, {progress.seconds:.0f}s"
            )
            self._next_line_s = progress.seconds + self._period_s
