"""What the layers above see of a task: its dataset and its environment, as protocols.

Datasets are map-style: a stable integer index and a digest per prompt.
Restore rehydrates prompts by dataset index, so a dataset must return the same
prompt for the same index in every process; :meth:`PromptDataset.identity`
lets restore check that it did. A dataset whose identity is a digest of the
row it builds may also give both from one build (:class:`IdentifiedRows`):
restore fetches every restored group's row and checks its identity.

Environments score a response; the gate runs them after generation. A
token-level :class:`Environment` scores response token ids (the simulated
gate); a :class:`TextEnvironment` scores the decoded text (a model gate
decodes the generated tokens with the model's tokenizer and hands the text
over). Plug in a verifier of your own task by implementing one of them; the
gate needs nothing else. A user's reward function (``reward.function``)
becomes a text environment too (:mod:`rollvault.rewards`), for any task whose
prompts are text.

A :class:`Task` puts one task's pieces together: its name (what
``dataset.kind`` says), how to build its dataset, the environment it scores
with (or none, when the user's ``reward.function`` scores it) and,
optionally, its supervised warm-up examples. Each folder under
``rollvault/tasks/`` exports one as ``TASK`` (see :mod:`rollvault.tasks.registry`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec

if TYPE_CHECKING:  # episodes builds on this module's scorers
    from rollvault.tasks.episodes import EpisodeEnvironment

__all__ = [
    "DatasetBuilder",
    "Environment",
    "IdentifiedRows",
    "PromptDataset",
    "PromptEnvironmentError",
    "RowDescriber",
    "RowDigestIdentity",
    "Score",
    "Task",
    "TextEnvironment",
    "TextScore",
    "WarmupExample",
    "WarmupSource",
    "describe_row",
    "identified_row_fetcher",
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


@runtime_checkable
class IdentifiedRows(Protocol):
    """A dataset that gives a row and its identity from one fetch (optional).

    For a dataset whose :meth:`PromptDataset.identity` builds the row to
    digest it (every generated task's): a restore needs both for each
    restored group, and would build each row twice. A dataset without it
    works as before (:func:`identified_row_fetcher` calls ``identity`` and
    ``__getitem__``).
    """

    def row_with_identity(self, idx: int) -> tuple[DatumSpec, str]:
        """``(self[idx], self.identity(idx))``, the row built once.

        The object's own ``identity``, whatever class defines it: a class whose
        subclasses may override ``identity`` asks it when they do, as
        :meth:`RowDigestIdentity.row_with_identity` does.
        """
        ...


class RowDigestIdentity:
    """A dataset whose identity is :func:`prompt_identity` of the row it builds.

    Gives :meth:`PromptDataset.identity` and :meth:`IdentifiedRows.row_with_identity`
    to a dataset that builds its rows (every generated task's), from its own
    ``__getitem__``.
    """

    def __getitem__(self, idx: int) -> DatumSpec:
        raise NotImplementedError

    def identity(self, idx: int) -> str:
        """SHA-256 of the prompt at ``idx`` (see :func:`prompt_identity`)."""
        return prompt_identity(self[idx])

    def row_with_identity(self, idx: int) -> tuple[DatumSpec, str]:
        """The prompt at ``idx`` and its :meth:`identity`, built once (a restore needs both).

        The digest of the row is the identity only while ``identity`` is this class's:
        a subclass that overrides it (to count or change it) is asked its own.
        """
        row = self[idx]
        if type(self).identity is not RowDigestIdentity.identity:
            return row, self.identity(idx)
        return row, prompt_identity(row)


def identified_row_fetcher(dataset: PromptDataset) -> Callable[[int], tuple[DatumSpec, str]]:
    """How to fetch ``(row, identity)`` of an index of ``dataset``: once per restore.

    The dataset's ``row_with_identity`` if it has one (:class:`IdentifiedRows`);
    otherwise ``identity``, then the row, in that order as before.
    """
    if isinstance(dataset, IdentifiedRows):
        return dataset.row_with_identity

    def fetch(idx: int) -> tuple[DatumSpec, str]:
        identity = dataset.identity(idx)
        return dataset[idx], identity

    return fetch


@runtime_checkable
class RowDescriber(Protocol):
    """A dataset that can say where a row comes from (a file and a line, say)."""

    def describe(self, idx: int) -> str:
        """Where the prompt at ``idx`` comes from, for messages: ``"data.jsonl line 4"``."""
        ...


def describe_row(dataset: PromptDataset, idx: int) -> str:
    """``"dataset index 3"``, plus where the row comes from when the dataset can say it.

    ``"dataset index 3 (data.jsonl line 4)"`` for a dataset with a ``describe``
    method (:class:`RowDescriber`), for the messages that name a row: a
    changed dataset refused on resume, a prompt that cannot be scored.
    """
    where = dataset.describe(idx) if isinstance(dataset, RowDescriber) else None
    return f"dataset index {idx}" + (f" ({where})" if where else "")


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
    correct: bool | None = None
    """The response solves the task: what accuracy counts. None when the environment
    does not say (a user reward function that returns only a reward); such a
    response is left out of the accuracy, never counted as wrong."""
    checks: Mapping[str, bool | float] = msgspec.field(default_factory=dict)
    """Named checks beside the reward (a user reward function's extra keys), logged
    with the attempt in ``attempts.jsonl``; they do not change the reward."""


class TextEnvironment(Protocol):
    """Scores one decoded response to one prompt."""

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        """Score ``response_text`` (decoded, without the eos token) to ``prompt``.

        ``finished`` is False when generation was cut at the token limit
        before the model ended its response. Raises
        :class:`PromptEnvironmentError` when the prompt cannot be scored.
        A coroutine, so an environment may wait on I/O or run slow scoring in
        a worker thread without blocking the controller's event loop.
        """
        ...


class DatasetBuilder(Protocol):
    """Builds a task's dataset from the run's ``dataset`` section."""

    def __call__(self, config: DatasetConfig, *, seed: int, vocab_size: int) -> PromptDataset:
        """The dataset for ``config``, a pure function of it and ``seed``.

        ``vocab_size`` is the generator's vocabulary: token-level tasks draw
        their prompt token ids below it; text tasks ignore it (the gate
        tokenizes their ``prompt_text``).
        """
        ...


WarmupExample = tuple[str, str]
"""``(prompt_text, answer)``: one pair of the supervised warm-up."""

WarmupSource = Callable[[PromptDataset], Sequence[WarmupExample]]
"""Gives a task's warm-up examples from the run's dataset."""


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One task: its name, its dataset, how it is scored, and its optional warm-up.

    A task scores with a token-level environment (the simulated gate), a
    text environment (a model gate), or both, or neither when it sets
    ``needs_reward_function`` (a dataset file: ``reward.function`` scores it);
    the composition of a run refuses a gate the task cannot be scored on. The
    environments are factories (a class will do), so every gate gets its own.
    """

    name: str
    """What ``dataset.kind`` says to select this task; the name of its folder."""
    build_dataset: DatasetBuilder
    token_environment: Callable[[], Environment] | None = None
    text_environment: Callable[[], TextEnvironment] | None = None
    episode_environment: Callable[[], EpisodeEnvironment] | None = None
    """A multi-turn environment (:mod:`rollvault.tasks.episodes`) every gate can run;
    the one-turn scorers above are the single-turn case of the same protocol."""
    warmup_examples: WarmupSource | None = None
    """None when the task has no supervised warm-up (``trainer.warmup.steps`` must be 0)."""
    needs_reward_function: bool = False
    """True when the task has no built-in scoring, so ``reward.function`` must name one
    (the file datasets: their rows come with no verifier)."""

    def __post_init__(self) -> None:
        no_environment = (
            self.token_environment is None
            and self.text_environment is None
            and self.episode_environment is None
        )
        if no_environment and not self.needs_reward_function:
            raise ValueError(
                f"task {self.name!r}: give a token_environment or a text_environment, "
                "or set needs_reward_function=True, or no gate can score it"
            )
