"""The rollout pump's turn sink: each finished turn of an attempt, committed in one mutation.

Staging the turn's row, committing the turn in the ledger (fenced by the
attempt id) and recording the episode's state (:mod:`.episodes`) happen in
one mutation section, so a snapshot sees a turn wholly committed or not at all.

Batching: a model gate's worker returns a whole generation batch at once, and
its attempts then hand over their turns in one turn of the event loop. The
committer collects the turns handed over in that turn and commits them
together (:meth:`TurnCommitter.commit_turn` waits for it): one mutation
section, one data-plane ``put`` of their rows (one validation pass) and one
``turns.jsonl`` write, instead of one of each per turn. Each turn's row is
in the data plane before its ledger commit, as before; a turn the ledger
refuses fails alone and its row is cleared. A caller already inside a
mutation section commits directly (a batch task waiting for the cut would
wait behind a checkpoint that waits for the caller).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from rollvault.controller.loop.episodes import EpisodeState, logical_id
from rollvault.controller.loop.gate import (
    AttemptRequest,
    CommittedTurn,
    FailureKind,
    GateAttemptError,
    PartialTurn,
)
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import TurnLogRecord
from rollvault.controller.loop.seal_journal import PartialRecord
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.dataplane.rows import Row
from rollvault.ledger.errors import LedgerError

__all__ = ["TurnCommitter"]


@dataclass(slots=True)
class _Handed:
    """A turn handed over and waiting for its batch's commit."""

    request: AttemptRequest
    turn: CommittedTurn
    done: asyncio.Future[None]
    refused: bool = False
    """Its row or its ledger commit was refused (the error is in ``done``)."""


class TurnCommitter:
    """Stages, commits and records each turn an attempt hands over (see the module docstring)."""

    def __init__(self, parts: RolloutParts) -> None:
        self._parts = parts
        self.turns_committed = 0
        self.batches = 0
        """Commit batches (mutation sections) the turns went through."""
        self._waiting: list[_Handed] = []
        self._flush: asyncio.Task[None] | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        """Batch tasks still running (the loop keeps only weak references to tasks)."""

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        """Commit ``turn`` with the others handed over in this turn of the event loop.

        Raises GateAttemptError when the ledger refuses it (a superseded or
        finished attempt); then its row is not left in the data plane.
        """
        item = _Handed(request, turn, asyncio.get_running_loop().create_future())
        if self._parts.cut.holds_mutation():
            await self._commit([item])
            if item.done.done():
                item.done.result()  # raises the refusal
        else:
            self._waiting.append(item)
            if self._flush is None:
                # Scheduled behind the attempts already woken by the same batch, so it
                # finds their turns waiting too.
                self._flush = asyncio.create_task(self._commit_waiting(), name="turn-commits")
                self._flushing.add(self._flush)
                self._flush.add_done_callback(self._flushing.discard)
            await item.done
        self._parts.partials.turn_committed(request.gate_rollout_id, turn.turn_index)

    async def _commit_waiting(self) -> None:
        handed, self._waiting = self._waiting, []
        self._flush = None
        # An attempt cancelled while it waited (the run stops) commits nothing.
        live = [item for item in handed if not item.done.done()]
        try:
            await self._commit(live)
        except asyncio.CancelledError:
            for item in live:
                item.done.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - raised in every attempt of the batch
            for item in live:
                _settle(item, error)
        for item in live:
            if not item.done.done():
                item.done.set_result(None)

    async def _commit(self, handed: list[_Handed]) -> None:
        """Stage, commit and log ``handed`` in one mutation section; a refused turn's
        future gets its GateAttemptError (a resolved future: raised here)."""
        if not handed:
            return
        parts = self._parts
        async with parts.cut.mutation():
            await self._stage(handed)
            records: list[TurnLogRecord] = []
            for item in handed:
                record = await self._commit_one(item)
                if record is not None:
                    records.append(record)
            parts.logs.turns.write_many(records)
            self.turns_committed += len(records)
            self.batches += 1

    async def _stage(self, handed: list[_Handed]) -> None:
        """Put the rows in the data plane: at once, or one by one if the batch is refused
        (so a bad row fails its own attempt, not its batch)."""
        rows: dict[str, Row] = {item.turn.key: item.turn.row for item in handed}
        data_plane = self._parts.data_plane
        if len(rows) == len(handed):
            try:
                await data_plane.put(STAGING_PARTITION, rows)
                return
            except Exception:  # noqa: BLE001 - retried one by one below, which attributes it
                if len(handed) == 1:
                    raise
        for item in handed:
            try:
                await data_plane.put(STAGING_PARTITION, {item.turn.key: item.turn.row})
            except Exception as error:  # noqa: BLE001 - raised in the attempt that handed it
                _settle(item, error)

    async def _commit_one(self, item: _Handed) -> TurnLogRecord | None:
        """Commit one staged turn in the ledger and record its episode state (in the cut)."""
        if item.refused:
            return None  # its row was refused
        parts = self._parts
        request, turn = item.request, item.turn
        key = logical_id(request.group_id, request.generation_index)
        try:
            revision = parts.ledger.commit_turn(
                parts.cut,
                request.group_id,
                generation_index=request.generation_index,
                gate_rollout_id=request.gate_rollout_id,
                staging_key=turn.key,
                turn_index=turn.turn_index,
            )
        except LedgerError as error:
            # A superseded or finished attempt: its row must not stay behind.
            await parts.data_plane.clear(STAGING_PARTITION, [turn.key])
            _settle(
                item,
                GateAttemptError(
                    request.gate_rollout_id, FailureKind.INFRA, f"turn refused: {error}"
                ),
            )
            return None
        previous = parts.episodes.get(key)
        rewards = list(previous.turn_rewards[: turn.turn_index]) if previous else []
        parts.episodes.record(
            key,
            EpisodeState(
                gate_rollout_id=request.gate_rollout_id,
                restore_class=turn.restore_class,
                turn_rewards=[*rewards, turn.reward],
                env_state=turn.env_state,
                env_state_revision=revision,
            ),
        )
        return TurnLogRecord(
            gate_rollout_id=request.gate_rollout_id,
            group_id=request.group_id,
            generation_index=request.generation_index,
            turn_index=turn.turn_index,
            staging_key=turn.key,
            num_tokens=int(np.asarray(turn.row["token_mask"]).sum()),
            incarnation=parts.logs.incarnation,
        )

    async def record_partial(self, request: AttemptRequest, partial: PartialTurn) -> None:
        """Journal a turn's partial output and keep it as the attempt's newest
        (:mod:`~rollvault.controller.loop.partials`). Outside the cut: it changes no
        ledger state; without a seal journal there is nothing to restore it from."""
        parts = self._parts
        if parts.seal_journal is None or request.group_id not in parts.ledger:
            return  # nothing to restore it from, or its group ended meanwhile (the next
            # commit_turn or seal of the attempt is refused and says so)
        origin = parts.group(request.group_id).origin
        record = PartialRecord(
            group_id=request.group_id,
            generation_index=request.generation_index,
            gate_rollout_id=request.gate_rollout_id,
            epoch=origin.epoch,
            dataset_idx=origin.dataset_idx,
            target_step=parts.ledger.get_group(request.group_id).target_step,
            turn_index=partial.turn_index,
            token_ids=list(partial.token_ids),
            logprobs=list(partial.logprobs),
            weight_versions=list(partial.weight_versions),
            seed_id=partial.seed_id,
        )
        if parts.seal_journal.partial(record) is not None:
            parts.partials.record(record)


def _settle(item: _Handed, error: Exception) -> None:
    item.refused = True
    if not item.done.done():
        item.done.set_exception(error)
