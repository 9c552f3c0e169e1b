"""A verifier for tasks with one exact answer per prompt, plus a reward for the format.

The built-in addition and reverse tasks differ only in what a well-formed
response and a valid answer look like; the reward rule is the same:
``answer_reward`` for the exact answer plus ``format_reward`` for the format,
so a correct response scores their sum, a well-formed wrong one
``format_reward``, anything else 0. A task subclasses
:class:`ExactAnswerEnvironment` and says what "well formed" means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rollvault.tasks.protocols import PromptEnvironmentError, TextScore

__all__ = ["ExactAnswerEnvironment"]


class ExactAnswerEnvironment:
    """Scores a response against the prompt's ``extra_env_info["answer"]``.

    Subclasses set :attr:`prompt_error` and :attr:`answer_shape` and implement
    :meth:`well_formed` and :meth:`valid_answer`.
    """

    prompt_error: ClassVar[type[PromptEnvironmentError]] = PromptEnvironmentError
    """Raised for a prompt whose answer is missing or invalid."""
    answer_shape: ClassVar[str] = "a string"
    """What a valid answer is, for the error message."""

    def __init__(self, *, answer_reward: float = 1.0, format_reward: float = 0.1) -> None:
        if answer_reward <= 0.0 or format_reward < 0.0:
            raise ValueError(
                f"{type(self).__name__}: answer_reward must be > 0 and format_reward >= 0, "
                f"got {answer_reward} and {format_reward}"
            )
        self.answer_reward = answer_reward
        self.format_reward = format_reward

    def well_formed(self, response_text: str, answer: str) -> bool:
        """The response has the task's shape (the model ended it: checked by the caller)."""
        raise NotImplementedError

    def valid_answer(self, answer: str) -> bool:
        """The prompt's answer is one this task can check against."""
        return True

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        """Score ``response_text`` (see the module docstring); a cut response is malformed."""
        answer = self._answer(prompt)
        format_ok = finished and self.well_formed(response_text, answer)
        correct = format_ok and response_text == answer
        reward = (self.answer_reward if correct else 0.0) + (
            self.format_reward if format_ok else 0.0
        )
        return TextScore(reward=reward, format_ok=format_ok, correct=correct)

    def _answer(self, prompt: Mapping[str, Any]) -> str:
        info = prompt.get("extra_env_info")
        answer = info.get("answer") if isinstance(info, Mapping) else None
        if not isinstance(answer, str) or not self.valid_answer(answer):
            raise self.prompt_error(
                f"prompt {prompt.get('idx')!r}: extra_env_info.answer must be "
                f"{self.answer_shape}, got {answer!r}"
            )
        return answer
