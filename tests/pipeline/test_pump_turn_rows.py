"""The rollout pump's turn sink keeps each attempt's committed rows for the seal journal."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rollvault.controller.loop.gate import (
    AttemptRequest,
    CommittedTurn,
    FailureKind,
    GateAttemptError,
)
from rollvault.controller.loop.rollout_pump import _RowKeepingSink
from rollvault.tasks.episodes import RestoreClass


class _Committer:
    """Stands in for the TurnCommitter: commits, or refuses turns of ``refused`` attempts."""

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused
        self.committed: list[str] = []

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        if request.gate_rollout_id in self.refused:
            raise GateAttemptError(request.gate_rollout_id, FailureKind.INFRA, "superseded")
        self.committed.append(turn.key)


def _request(rollout_id: str) -> AttemptRequest:
    return AttemptRequest(
        group_id="g1", generation_index=0, gate_rollout_id=rollout_id, prompt={}, weight_version=0
    )


def _turn(rollout_id: str, index: int) -> CommittedTurn:
    return CommittedTurn(
        turn_index=index,
        key=f"{rollout_id}/{index}",
        row={"input_ids": np.arange(index + 2, dtype=np.int64)},
        reward=0.0,
        restore_class=RestoreClass.RESTART_ONLY,
        env_state=None,
    )


def test_rows_are_kept_per_attempt_until_it_ends_and_refused_turns_are_not() -> None:
    committer = _Committer(refused={"b"})
    sink = _RowKeepingSink(committer)  # type: ignore[arg-type]

    async def run() -> None:
        await sink.commit_turn(_request("a"), _turn("a", 0))
        await sink.commit_turn(_request("a"), _turn("a", 1))
        with pytest.raises(GateAttemptError):
            await sink.commit_turn(_request("b"), _turn("b", 0))

    asyncio.run(run())
    assert committer.committed == ["a/0", "a/1"]
    kept = sink.rows("a")
    assert list(kept) == ["a/0", "a/1"]
    assert np.array_equal(kept["a/1"]["input_ids"], np.arange(3))
    assert sink.rows("b") == {}  # a refused turn's row is never journaled
    sink.forget("a")
    assert sink.rows("a") == {}
