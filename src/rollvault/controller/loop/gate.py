"""What the controller asks of a gate, and what it gets back.

A gate executes one attempt: an episode of one or more turns (model call,
then environment step; see :mod:`rollvault.tasks.episodes`). It
hands each finished turn to a :class:`TurnSink`, which stages the turn's row
and commits the turn in the ledger; it
writes the attempt's token rows into the data plane's ``rollout_staging``
partition under staging keys and returns a token-free outcome whose receipt
names those keys. The controller never sees tokens.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

import msgspec
import numpy as np

from rollvault.dataplane.interface import STAGING_PARTITION, DataPlane
from rollvault.dataplane.rows import Row, RowView
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.tasks.episodes import RestoreClass


class AttemptRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt to run: which sibling, which prompt, which weights."""

    group_id: str
    generation_index: int
    gate_rollout_id: str
    prompt: dict[str, Any]
    """The runtime prompt (a ``DatumSpec``)."""
    weight_version: int
    """The policy version the controller expects the gate to generate with."""
    resume: EpisodeResume | None = None
    """Set when the attempt continues an episode at its last committed turn (a restore)."""


class EpisodeResume(msgspec.Struct, frozen=True, kw_only=True):
    """Where an interrupted episode stands: its committed turns and environment state.

    The committed turns' rows are in the data plane under ``turn_keys``; the
    gate re-sends their token ids as the next call's prompt (never re-tokenized
    text) and rebuilds the environment per ``restore_class``: load
    ``env_state`` (restorable) or replay the committed actions (replayable).
    """

    turn_keys: list[str]
    turn_rewards: list[float]
    restore_class: RestoreClass
    env_state: dict[str, Any] | None
    env_state_revision: int
    partial: PartialTurn | None = None
    """The journaled prefix of the turn after the committed ones (``rollout.prefix_resume``):
    the gate continues that turn after it instead of generating it from its start."""
    partial_mask: list[int] | None = None
    """Loss mask of the prefix's tokens (``mask_stale``: 0 on stale ones); None: all 1."""


class PartialTurn(msgspec.Struct, frozen=True, kw_only=True):
    """The tokens a turn in flight has generated so far (``rollout.prefix_resume``).

    Cumulative: each partial of a turn holds its whole prefix, so the newest one
    is all a restore needs.
    """

    turn_index: int
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    """Per token, the policy version that generated it."""
    seed_id: str
    """What seeds the turn's chunks (the attempt that began the turn): a continuation by
    another attempt draws what the first one would have."""


class CommittedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One finished turn a gate hands to its :class:`TurnSink` to stage and commit."""

    turn_index: int
    key: str
    """The row's staging key: ``staging_key(gate_rollout_id, turn_index)``."""
    row: Row
    reward: float
    restore_class: RestoreClass
    env_state: dict[str, Any] | None
    """The environment's state after the turn (restorable environments), JSON builtins."""


class TurnSink(Protocol):
    """Stages a turn's row and commits the turn in the ledger, as one mutation."""

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        """Raise GateAttemptError when the attempt may no longer commit (superseded)."""
        ...

    async def record_partial(self, request: AttemptRequest, partial: PartialTurn) -> None:
        """Keep the partial output of a turn in flight (journaled; never blocks on disk)."""
        ...


_TURN_SINK: ContextVar[TurnSink | None] = ContextVar("rollvault_turn_sink", default=None)


@contextlib.contextmanager
def attempt_turn_sink(sink: TurnSink) -> Iterator[None]:
    """Run the attempts started inside the block with ``sink`` as their turn sink.

    A context variable rather than an argument of :meth:`Gate.run_attempt`,
    so the gate contract keeps one argument: a gate that stages its one row
    itself (and never commits a turn) keeps working unchanged.
    """
    token = _TURN_SINK.set(sink)
    try:
        yield
    finally:
        _TURN_SINK.reset(token)


def current_turn_sink(data_plane: DataPlane) -> TurnSink:
    """The sink of the running attempt; without a controller, one that only stages rows."""
    return _TURN_SINK.get() or StagingOnlySink(data_plane)


class StagingOnlySink:
    """The sink of a gate run without a controller (tests, tools): it only stages rows."""

    def __init__(self, data_plane: DataPlane) -> None:
        self._data_plane = data_plane

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        await self._data_plane.put(STAGING_PARTITION, {turn.key: turn.row})

    async def record_partial(self, request: AttemptRequest, partial: PartialTurn) -> None:
        """Nothing to keep it for: without a controller there is no restore."""


class AttemptOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A finished attempt: receipt, reward and the checks the gate ran."""

    receipt: dict[str, Any]
    """Gate receipt, shaped as :mod:`rollvault.ledger.receipts` documents."""
    reward: float
    reward_checks: RewardChecks
    reward_log_context: RewardLogContext
    num_tokens: int
    """Tokens generated by this attempt (the work it represents)."""
    weight_version: int
    """The policy version that actually generated the tokens."""
    checks: dict[str, bool | float] = msgspec.field(default_factory=dict)
    """Named checks of the reward (``correct``, ``format_ok``, a reward function's own),
    logged with the sealed attempt in ``attempts.jsonl``; never in the ledger."""


class FailureKind(enum.StrEnum):
    """Why an attempt failed, which decides whose retry budget it spends."""

    INFRA = "infra"
    """The machinery failed (worker lost, timeout): retry this sibling."""
    DATA = "data"
    """The prompt itself failed (environment error): counts against the group."""


class GateAttemptError(Exception):
    """An attempt failed; nothing it staged may be trusted."""

    def __init__(self, gate_rollout_id: str, kind: FailureKind, reason: str) -> None:
        super().__init__(f"attempt {gate_rollout_id} failed ({kind.value}): {reason}")
        self.gate_rollout_id = gate_rollout_id
        self.kind = kind
        self.reason = reason


class Gate(Protocol):
    """Executes attempts; accepts new policy weights between requests."""

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        """Run one attempt (an episode of one or more turns), return its outcome or raise
        GateAttemptError. Each finished turn goes to :func:`current_turn_sink`."""
        ...

    async def update_weights(self, weight_version: int) -> None:
        """Generate with policy ``weight_version`` from the next request on."""
        ...

    async def close(self) -> None:
        """Release workers; no attempt runs after this."""
        ...


def staged_row_digest(row: RowView) -> str:
    """Content digest of a staged row, as a receipt's ``row_digests`` carries it.

    Covers every array field in name order, with dtype and length, so the
    finalizer detects any row that is not the one the gate staged.
    """
    # The same bytes in the same order as one update per part (receipts on disk carry
    # these digests), hashed at once: the hot path digests every staged row.
    parts: list[bytes] = []
    for name in sorted(row):
        value = row[name]
        parts.append(name.encode() + b"\0")
        if isinstance(value, np.ndarray):
            parts.append(f"{value.dtype.str}:{value.shape[0]}\0".encode())
            parts.append(np.ascontiguousarray(value).tobytes())
        else:
            parts.append(repr(value).encode() + b"\0")
    return hashlib.sha256(b"".join(parts)).hexdigest()
