"""The reverse task's verifier: the exact reversal, plus a small reward for the format.

A response is well formed when it is as many ASCII digits as the prompt's
answer and the model ended it (eos) itself. It is correct when it equals
``extra_env_info["answer"]`` exactly. Rewards: ``answer_reward`` (1.0) for
the exact reversal plus ``format_reward`` (0.1) for the format, so a correct
response scores 1.1, a well-formed wrong one 0.1, anything else 0.
"""

from __future__ import annotations

from rollvault.tasks.exact_answer import ExactAnswerEnvironment
from rollvault.tasks.protocols import PromptEnvironmentError

__all__ = ["ReverseEnvironment", "ReversePromptError"]


class ReversePromptError(PromptEnvironmentError):
    """A prompt handed to the reverse environment carries no digit answer to check against."""


class ReverseEnvironment(ExactAnswerEnvironment):
    """Scores responses to ``"DDDD="`` prompts (see the module docstring)."""

    prompt_error = ReversePromptError
    answer_shape = "a string of digits"

    def well_formed(self, response_text: str, answer: str) -> bool:
        """As many ASCII digits as the answer."""
        return len(response_text) == len(answer) and _digits(response_text)

    def valid_answer(self, answer: str) -> bool:
        """ASCII digits only."""
        return _digits(answer)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()
