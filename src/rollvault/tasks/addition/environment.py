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

from rollvault.tasks.exact_answer import ExactAnswerEnvironment
from rollvault.tasks.protocols import PromptEnvironmentError

__all__ = ["AdditionEnvironment", "AdditionPromptError"]

_ANSWER_SHAPE = re.compile(r"[0-9]{1,3}")


class AdditionPromptError(PromptEnvironmentError):
    """A prompt handed to the addition environment carries no answer to check against."""


class AdditionEnvironment(ExactAnswerEnvironment):
    """Scores responses to ``"AA+BB="`` prompts (see the module docstring)."""

    prompt_error = AdditionPromptError

    def well_formed(self, response_text: str, answer: str) -> bool:
        """One to three ASCII digits."""
        return _ANSWER_SHAPE.fullmatch(response_text) is not None
