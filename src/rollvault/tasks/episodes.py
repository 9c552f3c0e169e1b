"""Episodes: the environment protocol every gate runs, single-turn tasks included.

An :class:`EpisodeEnvironment` is reset with the prompt, then stepped with
each model call's action until it says ``done`` (or the gate reaches the
environment's ``max_turns``). A **turn** is one model call plus the
observation that follows it; the observation's tokens are the prompt suffix
of the next call. A single-turn task is the one-turn case: its scorer
(:class:`~rollvault.tasks.protocols.Environment` or
:class:`~rollvault.tasks.protocols.TextEnvironment`) is wrapped by
:func:`as_episode` into an episode whose first step scores the response and
ends it, so every gate has one code path.

Restore classes (how a killed episode continues, see :class:`RestoreClass`):
``restorable`` environments export their state (:meth:`EpisodeEnvironment.state_dict`)
as JSON-compatible builtins, which a rollout snapshot stores per in-flight
attempt; ``replayable`` ones are deterministic given the prompt and the
actions, so restore replays the committed actions into a fresh environment;
``restart_only`` episodes restart at their first turn.

Side effects: :meth:`EpisodeEnvironment.step` receives an idempotency key
derived from the attempt that generated the turn and the turn's index
(:func:`idempotency_key`), the same when a committed turn is replayed, so a
tool call with an effect can refuse to apply it twice.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

import msgspec

from rollvault.tasks.protocols import Environment, TextEnvironment

__all__ = [
    "Action",
    "EpisodeEnvironment",
    "EpisodeStateError",
    "Observation",
    "RestoreClass",
    "SingleTurnEpisode",
    "SingleTurnTextEpisode",
    "StepResult",
    "as_episode",
    "episode_factory",
    "checked_state",
    "idempotency_key",
]


class RestoreClass(enum.StrEnum):
    """How a restore continues an episode that a kill interrupted."""

    RESTORABLE = "restorable"
    """``state_dict``/``load_state_dict``: continue at the last committed turn."""
    REPLAYABLE = "replayable"
    """Deterministic given the prompt and actions: replay the committed actions, then continue."""
    RESTART_ONLY = "restart_only"
    """Restart the episode at its first turn (the restore log says so)."""


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One model call's output as the environment sees it."""

    token_ids: list[int]
    """The generated token ids (the stop token included when the model ended the call)."""
    text: str | None
    """The decoded response without its stop token; None for a gate without a tokenizer."""
    finished: bool
    """False when generation was cut at the token limit."""


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What the environment shows the model before its next call."""

    text: str = ""
    token_ids: list[int] | None = None
    """Token ids to append as they are; None lets the gate tokenize ``text``."""


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """The environment's answer to one action."""

    observation: Observation
    reward: float
    """This turn's reward; an episode's reward is the sum over its turns."""
    done: bool
    format_ok: bool = True
    """The action had the shape the task asks for (the last turn's decides the episode's)."""
    correct: bool | None = None
    """Whether the episode solved the task (meaningful on its last turn)."""
    info: dict[str, bool | float] = msgspec.field(default_factory=dict)
    """Named checks logged with the attempt."""


class EpisodeStateError(ValueError):
    """An environment's state is not JSON-compatible, or does not fit the environment."""


@runtime_checkable
class EpisodeEnvironment(Protocol):
    """A (possibly multi-turn) environment; one instance per attempt."""

    restore_class: RestoreClass
    max_turns: int
    """The gate stops the episode after this many model calls."""

    async def reset(self, sample: Mapping[str, Any]) -> Observation:
        """Start an episode on ``sample`` (the runtime prompt); returns what follows the prompt."""
        ...

    async def step(self, action: Action, *, idempotency_key: str) -> StepResult:
        """Apply one action; raises PromptEnvironmentError when the prompt cannot be played."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The episode's state as JSON-compatible builtins (``restorable`` environments)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a state :meth:`state_dict` returned (after :meth:`reset`)."""
        ...


def idempotency_key(staging_key: str) -> str:
    """The key of a turn's side effects: from the turn's staging key (attempt + turn index).

    A committed turn keeps the staging key of the attempt that generated it,
    also when a later attempt continues the episode, so replaying the turn
    passes the same key.
    """
    return hashlib.sha256(f"turn-effect:{staging_key}".encode()).hexdigest()[:32]


def checked_state(state: object, *, where: str) -> dict[str, Any]:
    """``state`` as fresh JSON builtins, or :class:`EpisodeStateError` naming ``where``."""
    if not isinstance(state, dict):
        raise EpisodeStateError(f"{where}: state_dict() must return a dict, got {type(state)}")
    try:
        decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(state))
    except (TypeError, msgspec.EncodeError) as exc:
        raise EpisodeStateError(f"{where}: state_dict() is not JSON-compatible: {exc}") from exc
    return decoded


class _StatelessOneTurn:
    """What the single-turn wrappers share: one step, nothing to save."""

    restore_class = RestoreClass.REPLAYABLE
    max_turns = 1

    def __init__(self) -> None:
        self._sample: Mapping[str, Any] = {}

    async def reset(self, sample: Mapping[str, Any]) -> Observation:
        self._sample = sample
        return Observation()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise EpisodeStateError(f"a single-turn episode has no state, got {dict(state)}")


class SingleTurnEpisode(_StatelessOneTurn):
    """A token-level scorer as a one-turn episode."""

    def __init__(self, scorer: Environment) -> None:
        super().__init__()
        self.scorer = scorer

    async def step(self, action: Action, *, idempotency_key: str) -> StepResult:
        score = self.scorer.score(dict(self._sample), action.token_ids)
        return StepResult(
            observation=Observation(), reward=score.reward, done=True, format_ok=score.format_ok
        )


class SingleTurnTextEpisode(_StatelessOneTurn):
    """A text scorer as a one-turn episode."""

    def __init__(self, scorer: TextEnvironment) -> None:
        super().__init__()
        self.scorer = scorer

    async def step(self, action: Action, *, idempotency_key: str) -> StepResult:
        if action.text is None:
            raise EpisodeStateError("a text environment needs a gate that decodes responses")
        score = await self.scorer.score_text(self._sample, action.text, finished=action.finished)
        return StepResult(
            observation=Observation(),
            reward=score.reward,
            done=True,
            format_ok=score.format_ok,
            correct=score.correct,
            info=dict(score.checks),
        )


def as_episode(
    environment: Environment | TextEnvironment | EpisodeEnvironment,
) -> EpisodeEnvironment:
    """``environment`` as an episode: multi-turn ones as they are, scorers as one turn."""
    if isinstance(environment, EpisodeEnvironment):
        return environment
    if hasattr(environment, "score_text"):
        return SingleTurnTextEpisode(cast(TextEnvironment, environment))
    if hasattr(environment, "score"):
        return SingleTurnEpisode(environment)
    raise TypeError(
        f"{type(environment).__name__} is no environment: give it score(), score_text(), "
        "or reset()/step() with restore_class and max_turns"
    )


def observation_bytes_ids(text: str, vocab_size: int) -> list[int]:
    """Token ids of ``text`` for a gate without a tokenizer: its UTF-8 bytes, below ``vocab_size``."""
    return [byte % vocab_size for byte in text.encode()]


EpisodeSource = Environment | TextEnvironment | Callable[[], EpisodeEnvironment]
"""What a gate is given: a (stateless, shared) scorer, or a factory of episodes."""


def episode_factory(environment: EpisodeSource, *, where: str) -> Callable[[], EpisodeEnvironment]:
    """A fresh episode per attempt: a factory as it is; a scorer wrapped as one turn."""
    is_class = isinstance(environment, type)
    if not is_class and (hasattr(environment, "score") or hasattr(environment, "score_text")):
        # Decided once, not per attempt: as_episode's isinstance against a runtime
        # protocol costs more than the rest of a single-turn episode's set-up.
        scorer: Any = environment
        if isinstance(scorer, EpisodeEnvironment):
            return lambda: scorer
        if hasattr(scorer, "score_text"):
            return lambda: SingleTurnTextEpisode(scorer)
        return lambda: SingleTurnEpisode(scorer)
    if (not is_class and isinstance(environment, EpisodeEnvironment)) or not callable(environment):
        raise TypeError(
            f"{where}: give a multi-turn environment as a factory (its class), so that every "
            f"attempt gets its own; got {environment!r}"
        )
    return environment
