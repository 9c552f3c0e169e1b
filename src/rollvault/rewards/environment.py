"""A user's reward function as a text environment: what a model gate scores with.

:class:`RewardFunctionEnvironment` calls ``function(response_text, sample)``.
``sample`` is the dataset row as a dict: ``extra_env_info["row"]`` when the
prompt carries it (a dataset file: the whole row), else the prompt as
``{"prompt": <prompt_text, or the chat messages>, **extra_env_info}`` (so a
built-in task such as ``addition`` can be scored by a user function too:
``sample["answer"]`` is its answer). For a built-in function ``answer`` is
always the task's answer (``extra_env_info["answer"]``) when the task has
one. Each call gets its own deep copy, so a function that changes its sample
changes nothing else.

The function returns:

- a number (``int`` or ``float``, not ``bool``): the reward;
- or a mapping with ``reward`` (a number), and optionally ``correct`` (a
  bool: what accuracy counts), ``format_ok`` (a bool: the finalizer's format
  check, ``reward.format_penalty``; true when absent) and any other named
  checks (bool or number values), logged with the attempt in
  ``attempts.jsonl``.

Without ``correct`` (a plain number, or a mapping without it) a response is
left out of the accuracy, never counted as wrong or right: a reward of 0.1
may be partial credit, and only the function knows what is correct. A run
none of whose responses say has no accuracy metric.

A function that raises, or returns a non-finite reward or a value of another
type, fails that attempt with :class:`RewardFunctionScoreError` (a
:class:`~rollvault.tasks.protocols.PromptEnvironmentError`), whose message
names the exception or the value and the dataset row: the gate makes it a
data failure, the run goes on, and ``rollout.max_group_retries`` decides
when the prompt is given up. ``async def`` functions are awaited; any other
user function runs in a worker thread (:func:`asyncio.to_thread`), so a slow
reward never blocks the controller's event loop; the built-ins run inline.
A user function's call that runs past ``reward.timeout_s`` fails its attempt
the same way (:class:`RewardFunctionTimeoutError`): a hung function holds
no generation slot forever. Python cannot stop a thread, so a hung sync
function keeps its worker thread; only its attempt is released.

``finished`` (whether the model ended its response itself) is not passed on:
a response cut at ``gate.local_model.max_new_tokens`` is the finalizer's
overlong check (``reward.mask_overlong``, ``reward.overlong_penalty``).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from rollvault.config.schema import RewardConfig
from rollvault.rewards.errors import (
    RewardFunctionRaisedError,
    RewardFunctionResultError,
    RewardFunctionTimeoutError,
)
from rollvault.rewards.loading import LoadedRewardFunction, load_reward_function
from rollvault.tasks.protocols import TextScore

__all__ = ["RESERVED_RESULT_KEYS", "RewardFunctionEnvironment", "reward_sample", "text_score_of"]

RESERVED_RESULT_KEYS: Final = ("reward", "correct", "format_ok")
"""Keys of a mapping result with a meaning of their own; every other key is a named check."""


class RewardFunctionEnvironment:
    """Scores responses with a reward function (see the module docstring)."""

    def __init__(self, loaded: LoadedRewardFunction, *, timeout_s: float | None = None) -> None:
        self._loaded = loaded
        self._timeout_s = timeout_s

    @classmethod
    def from_config(cls, config: RewardConfig) -> RewardFunctionEnvironment:
        """The environment of ``config.function``, imported and checked (a ``ConfigError`` if not)."""
        return cls(load_reward_function(config), timeout_s=config.timeout_s)

    @property
    def loaded(self) -> LoadedRewardFunction:
        """The function this environment calls."""
        return self._loaded

    @property
    def timeout_s(self) -> float | None:
        """Seconds a call of a user function may take (``reward.timeout_s``); None: no limit."""
        return self._timeout_s

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        loaded = self._loaded
        sample = reward_sample(prompt, task_answer=loaded.is_builtin)
        limit = asyncio.timeout(None if loaded.is_builtin else self._timeout_s)
        try:
            async with limit:
                result = await self._call(response_text, sample)
        # User code: whatever it raises fails this attempt, never the run (DESIGN, Security).
        except Exception as error:
            if limit.expired():  # not a TimeoutError the function raised itself
                raise RewardFunctionTimeoutError(
                    f"{loaded.spec.setting} did not return within reward.timeout_s="
                    f"{self._timeout_s} s ({_row_of(prompt)})"
                ) from error
            raise RewardFunctionRaisedError(
                f"{loaded.spec.setting} raised {type(error).__name__}: {error} ({_row_of(prompt)})"
            ) from error
        return text_score_of(result, where=f"{loaded.spec.setting} ({_row_of(prompt)})")

    async def _call(self, response_text: str, sample: dict[str, Any]) -> object:
        function = self._loaded.function
        if self._loaded.is_async:
            result = await function(response_text, sample)
        elif self._loaded.is_builtin:
            result = function(response_text, sample)
        else:
            result = await asyncio.to_thread(function, response_text, sample)
        if inspect.isawaitable(result):  # e.g. a partial of an async function
            result = await result
        return result


def reward_sample(prompt: Mapping[str, Any], *, task_answer: bool = False) -> dict[str, Any]:
    """The ``sample`` a reward function gets for ``prompt`` (a fresh copy each call).

    ``task_answer``: set ``sample["answer"]`` to ``extra_env_info["answer"]``
    when that is present (what the built-ins compare with).
    """
    info = prompt.get("extra_env_info")
    info = info if isinstance(info, Mapping) else {}
    row = info.get("row")
    if isinstance(row, Mapping):
        sample = copy.deepcopy(dict(row))
    else:
        text = prompt.get("prompt_text")
        shown = text if text is not None else prompt.get("messages")
        sample = copy.deepcopy({**info, "prompt": shown})
    if task_answer and info.get("answer") is not None:
        sample["answer"] = info["answer"]
    return sample


def text_score_of(result: object, *, where: str) -> TextScore:
    """Check a reward function's result and make it a score; ``where`` prefixes any error."""
    if isinstance(result, Mapping):
        return _mapping_score(result, where)
    return TextScore(reward=_reward(result, f"{where} returned"), format_ok=True)


def _mapping_score(result: Mapping[Any, Any], where: str) -> TextScore:
    if "reward" not in result:
        raise RewardFunctionResultError(
            f"{where} returned a mapping without 'reward' (keys: {sorted(map(str, result))})"
        )
    checks: dict[str, bool | float] = {}
    for key, value in result.items():
        if not isinstance(key, str):
            raise RewardFunctionResultError(
                f"{where} returned a mapping with a non-string key {key!r}"
            )
        if key not in RESERVED_RESULT_KEYS:
            checks[key] = _check_value(value, f"{where}: check {key!r}")
    correct = result.get("correct")
    return TextScore(
        reward=_reward(result["reward"], f"{where} returned a 'reward' of"),
        format_ok=_flag(result.get("format_ok", True), f"{where}: 'format_ok'"),
        correct=None if correct is None else _flag(correct, f"{where}: 'correct'"),
        checks=checks,
    )


def _reward(value: object, where: str) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise RewardFunctionResultError(
            f"{where} {value!r} of type {type(value).__name__}; a reward is a number "
            "(int or float, not bool), or a mapping with 'reward'"
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise RewardFunctionResultError(
            f"{where} {reward}: a reward must be finite (not NaN or infinite)"
        )
    return reward


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise RewardFunctionResultError(
            f"{where} must be a bool, got {value!r} of type {type(value).__name__}"
        )
    return bool(value)


def _check_value(value: object, where: str) -> bool | float:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    raise RewardFunctionResultError(
        f"{where} must be a bool or a finite number, got {value!r} of type {type(value).__name__}"
    )


def _row_of(prompt: Mapping[str, Any]) -> str:
    return f"dataset row idx={prompt.get('idx')!r}"
