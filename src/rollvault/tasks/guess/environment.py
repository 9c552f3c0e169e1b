"""The guessing game: find a hidden digit in at most ``max_turns`` guesses, told higher or lower.

Each turn the model guesses one digit (its whole response, ended by the
model). The environment answers ``"+"`` (the secret is higher), ``"-"``
(lower) or ends the episode when the guess is right. A response that is not
exactly one digit, or was cut at the token limit, ends the episode unscored
(format failure). Rewards: ``found_reward`` (1.0) on the turn that finds the
secret, plus ``consistent_reward`` (0.1) for each guess that agrees with all
feedback so far (it lies inside the interval still possible), so that
using the feedback pays before the secret is found.

The environment is ``restorable``: its whole state (secret, the interval
still possible, turns taken) is a small JSON dict. Without a tokenizer
(the simulated gate) the guess is the first generated token id modulo 10.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollvault.tasks.episodes import (
    Action,
    EpisodeStateError,
    Observation,
    RestoreClass,
    StepResult,
)
from rollvault.tasks.protocols import PromptEnvironmentError

__all__ = ["GuessEnvironment", "HIGHER", "LOWER"]

HIGHER = "+"
LOWER = "-"
DEFAULT_MAX_TURNS = 4
"""Binary search finds any of ten digits in four guesses."""


class GuessEnvironment:
    """One game of guess-the-digit (see the module docstring)."""

    restore_class = RestoreClass.RESTORABLE

    def __init__(
        self,
        *,
        max_turns: int = DEFAULT_MAX_TURNS,
        found_reward: float = 1.0,
        consistent_reward: float = 0.1,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"GuessEnvironment: max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.found_reward = found_reward
        self.consistent_reward = consistent_reward
        self._state: dict[str, Any] = {}

    async def reset(self, sample: Mapping[str, Any]) -> Observation:
        info = sample.get("extra_env_info")
        secret = info.get("secret") if isinstance(info, Mapping) else None
        if isinstance(secret, bool) or not isinstance(secret, int) or not 0 <= secret <= 9:
            raise PromptEnvironmentError(
                f"prompt {sample.get('idx')!r}: extra_env_info.secret must be a digit 0..9, "
                f"got {secret!r}"
            )
        self._state = {"secret": secret, "low": 0, "high": 9, "turns": 0}
        return Observation()

    async def step(self, action: Action, *, idempotency_key: str) -> StepResult:
        guess = _guess(action)
        state = self._state
        state["turns"] += 1
        if guess is None:
            return StepResult(observation=Observation(), reward=0.0, done=True, format_ok=False)
        reward = self.consistent_reward if state["low"] <= guess <= state["high"] else 0.0
        if guess == state["secret"]:
            return StepResult(
                observation=Observation(),
                reward=reward + self.found_reward,
                done=True,
                correct=True,
            )
        if guess < state["secret"]:
            state["low"] = max(state["low"], guess + 1)
            feedback = HIGHER
        else:
            state["high"] = min(state["high"], guess - 1)
            feedback = LOWER
        last = state["turns"] >= self.max_turns
        return StepResult(
            observation=Observation(text=feedback),
            reward=reward,
            done=last,
            correct=False if last else None,
        )

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        expected = {"secret", "low", "high", "turns"}
        if set(state) != expected or not all(isinstance(state[k], int) for k in expected):
            raise EpisodeStateError(
                f"GuessEnvironment: a state has exactly the int fields {sorted(expected)}, "
                f"got {dict(state)}"
            )
        self._state = dict(state)


def _guess(action: Action) -> int | None:
    if action.text is None:
        return action.token_ids[0] % 10 if action.token_ids else None
    text = action.text
    if not action.finished or len(text) != 1 or not text.isdigit():
        return None
    return int(text)
