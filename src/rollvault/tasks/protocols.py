"""What the layers above see of a task: its dataset and its environment, as protocols.

Datasets are map-style: a stable integer index and a digest per prompt.
Restore rehydrates prompts by dataset index, so a dataset must return the same
prompt for the same index in every process; :meth:`PromptDataset.identity`
lets restore check that it did.

Environments score a response; the gate runs them after generation. A
token-level :class:`Environment` scores response token ids (the simulated
gate); a :class:`TextEnvironment` scores the decoded text (a model gate
decodes the generated tokens with the model's tokenizer and hands the text
over). Plug in a verifier of your own task by implementing one of them; the
gate needs nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from rollvault.ledger.datum import DatumSpec

__all__ = [
    "Environment",
    "PromptDataset",
    "PromptEnvironmentError",
    "Score",
    "TextEnvironment",
    "TextScore",
    "prompt_identity",
]


@runtime_checkable
class PromptDataset(Protocol):
    """A stable map-style dataset: same index, same prompt, in any process."""

    def __len__(self) -> int:
        """Number of prompts in one epoch."""
        ...

    def __getitem__(self, idx: int) -> DatumSpec:
        """The prompt at ``idx`` (0 <= idx < len); its ``idx`` field equals ``idx``."""
        ...

    def identity(self, idx: int) -> str:
        """A stable digest of the prompt at ``idx``, compared on restore."""
        ...


def prompt_identity(datum: DatumSpec) -> str:
    """SHA-256 hex of the prompt's canonical JSON (sorted keys), stable across processes."""
    return hashlib.sha256(msgspec.json.encode(datum, order="sorted")).hexdigest()


class Score(msgspec.Struct, frozen=True, kw_only=True):
    """An environment's verdict on one response."""

    reward: float
    format_ok: bool


class Environment(Protocol):
    """Scores one response to one prompt."""

    def score(self, prompt: dict[str, Any], response_token_ids: Sequence[int]) -> Score:
        """Return the response's reward and whether its format is acceptable."""
        ...


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
