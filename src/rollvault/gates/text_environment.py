"""Text environments: score a decoded response to a prompt.

A model gate decodes the generated tokens with the model's tokenizer and
hands the text to a :class:`TextEnvironment`; the environment returns the
reward and the checks. Plug in a verifier of your own task by implementing
the protocol; the gate needs nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

__all__ = ["PromptEnvironmentError", "TextEnvironment", "TextScore"]


class PromptEnvironmentError(ValueError):
    """The prompt lacks what the environment needs to score it (a data failure)."""


class TextScore(msgspec.Struct, frozen=True, kw_only=True):
    """An environment's verdict on one text response."""

    reward: float
    format_ok: bool
    """The response has the shape the task asks for (whether or not it is right)."""
    correct: bool
    """The response solves the task (what accuracy counts)."""


class TextEnvironment(Protocol):
    """Scores one decoded response to one prompt."""

    @property
    def success_reward(self) -> float:
        """The least reward a correct response gets (so a trainer can count accuracy)."""
        ...

    def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        """Score ``response_text`` (decoded, without the eos token) to ``prompt``.

        ``finished`` is False when generation was cut at the token limit
        before the model ended its response. Raises
        :class:`PromptEnvironmentError` when the prompt cannot be scored.
        """
        ...
