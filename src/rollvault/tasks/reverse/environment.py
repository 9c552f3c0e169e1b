"""The reverse task's verifier: the exact reversal, plus a small reward for the format.

A response is well formed when it is as many ASCII digits as the prompt's
answer and the model ended it (eos) itself. It is correct when it equals
``extra_env_info["answer"]`` exactly. Rewards: ``answer_reward`` (1.0) for
the exact reversal plus ``format_reward`` (0.1) for the format, so a correct
response scores 1.1, a well-formed wrong one 0.1, anything else 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollvault.tasks.protocols import PromptEnvironmentError, TextScore

__all__ = ["ReverseEnvironment", "ReversePromptError"]


class ReversePromptError(PromptEnvironmentError):
    """A prompt handed to the reverse environment carries no digit answer to check against."""


class ReverseEnvironment:
    """Scores responses to ``"DDDD="`` prompts (see the module docstring)."""

    def __init__(self, *, answer_reward: float = 1.0, format_reward: float = 0.1) -> None:
        if answer_reward <= 0.0 or format_reward < 0.0:
            raise ValueError(
                f"ReverseEnvironment: answer_reward must be > 0 and format_reward >= 0, "
                f"got {answer_reward} and {format_reward}"
            )
        self.answer_reward = answer_reward
        self.format_reward = format_reward

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        answer = _answer(prompt)
        format_ok = (
            finished
            and len(response_text) == len(answer)
            and response_text.isascii()
            and response_text.isdigit()
        )
        correct = format_ok and response_text == answer
        reward = (self.answer_reward if correct else 0.0) + (
            self.format_reward if format_ok else 0.0
        )
        return TextScore(reward=reward, format_ok=format_ok, correct=correct)


def _answer(prompt: Mapping[str, Any]) -> str:
    info = prompt.get("extra_env_info")
    answer = info.get("answer") if isinstance(info, Mapping) else None
    if not isinstance(answer, str) or not answer.isascii() or not answer.isdigit():
        raise ReversePromptError(
            f"prompt {prompt.get('idx')!r}: extra_env_info.answer must be a string of digits, "
            f"got {answer!r}"
        )
    return answer
