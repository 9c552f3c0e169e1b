"""The addition task's verifier: exact answer, plus a small reward for the format.

A response is well formed when it is one to three ASCII digits and the model
ended it (eos) itself. It is correct when it is well formed and equals the
prompt's ``extra_env_info["answer"]`` exactly (no leading zeros). Rewards:
``answer_reward`` (1.0) for the exact answer plus ``format_reward`` (0.1) for
the format, so a correct response scores 1.1, a well-formed wrong one 0.1,
anything else 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rollvault.tasks.protocols import PromptEnvironmentError, TextScore

__all__ = ["AdditionEnvironment", "AdditionPromptError"]

_ANSWER_SHAPE = re.compile(r"[0-9]{1,3}")


class AdditionPromptError(PromptEnvironmentError):
    """A prompt handed to the addition environment carries no answer to check against."""


class AdditionEnvironment:
    """Scores responses to ``"AA+BB="`` prompts (see the module docstring)."""

    def __init__(self, *, answer_reward: float = 1.0, format_reward: float = 0.1) -> None:
        if answer_reward <= 0.0 or format_reward < 0.0:
            raise ValueError(
                f"AdditionEnvironment: answer_reward must be > 0 and format_reward >= 0, "
                f"got {answer_reward} and {format_reward}"
            )
        self.answer_reward = answer_reward
        self.format_reward = format_reward

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        answer = _answer(prompt)
        format_ok = finished and _ANSWER_SHAPE.fullmatch(response_text) is not None
        correct = format_ok and response_text == answer
        reward = (self.answer_reward if correct else 0.0) + (
            self.format_reward if format_ok else 0.0
        )
        return TextScore(reward=reward, format_ok=format_ok, correct=correct)


def _answer(prompt: Mapping[str, Any]) -> str:
    info = prompt.get("extra_env_info")
    answer = info.get("answer") if isinstance(info, Mapping) else None
    if not isinstance(answer, str):
        raise AdditionPromptError(
            f"prompt {prompt.get('idx')!r}: extra_env_info.answer must be a string, got {answer!r}"
        )
    return answer
