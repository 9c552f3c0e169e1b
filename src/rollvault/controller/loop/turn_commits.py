"""The rollout pump's turn sink: each finished turn of an attempt, committed in one mutation.

Staging the turn's row, committing the turn in the ledger (fenced by the
attempt id) and recording the episode's state (:mod:`.episodes`) happen in
one mutation section, so a snapshot sees a turn wholly committed or not at all.

Batching: a model gate's worker returns a whole generation batch at once, and
its attempts then hand over their turns in one turn of the event loop. The
committer collects the turns handed over in that turn and commits them
together (:class:`~rollvault.controller.loop.tick_batches.TickBatch`;
:meth:`TurnCommitter.commit_turn` waits for it): one mutation
section, one data-plane ``put`` of their rows (one validation pass) and one
``turns.jsonl`` write, instead of one of each per turn. Each turn's row is
in the data plane before its ledger commit, as before; a turn the ledger
refuses fails alone and its row is cleared. A caller already inside a
mutation section commits directly (a batch task waiting for the cut would
wait behind a checkpoint that waits for the caller).
"""

from __future__ import annotations

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
from rollvault.controller.loop.tick_batches import Handed, TickBatch
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.dataplane.rows import Row
from rollvault.ledger.errors import LedgerError

__all__ = ["TurnCommitter"]


_Turn = tuple[AttemptRequest, CommittedTurn]
"""A turn handed over, with the attempt that handed it."""


class TurnCommitter:
    """Stages, commits and records each turn an attempt hands over (see the module docstring)."""

    def __init__(self, parts: RolloutParts) -> None:
        self._parts = parts
        self.turns_committed = 0
        self._batches = TickBatch[_Turn, None](self._commit_batch, name="turn-commits")

    @property
    def batches(self) -> int:
        """Commit batches (mutation sections) the turns handed over went through."""
        return self._batches.batches

    async def drain(self) -> None:
        """Wait until every commit batch already started has ended."""
        await self._batches.drain()

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        """Commit ``turn`` with the others handed over in this turn of the event loop.

        Raises GateAttemptError when the ledger refuses it (a superseded or
        finished attempt); then its row is not left in the data plane.
        """
        if not self._parts.cut.holds_mutation():
            await self._batches.submit((request, turn))
            return
        (error,) = await self._commit([(request, turn)])
        if error is not None:
            raise error

    async def _commit_batch(self, batch: list[Handed[_Turn, None]]) -> None:
        errors = await self._commit([entry.item for entry in batch])
        for entry, error in zip(batch, errors, strict=True):
            if error is None:
                entry.settle(None)
            else:
                entry.fail(error)

    async def _commit(self, turns: list[_Turn]) -> list[Exception | None]:
        """Stage, commit and log ``turns`` in one mutation section; each one's error
        (its row or its turn refused), or None."""
        parts = self._parts
        async with parts.cut.mutation():
            errors = await self._stage(turns)
            records: list[TurnLogRecord] = []
            for position, (request, turn) in enumerate(turns):
                if errors[position] is not None:
                    continue  # its row was refused
                committed = await self._commit_one(request, turn)
                if isinstance(committed, Exception):
                    errors[position] = committed
                else:
                    records.append(committed)
            parts.logs.turns.write_many(records)
            self.turns_committed += len(records)
        return errors

    async def _stage(self, turns: list[_Turn]) -> list[Exception | None]:
        """Put the rows in the data plane: at once, or one by one if the batch is refused
        (so a bad row fails its own attempt, not its batch)."""
        rows: dict[str, Row] = {turn.key: turn.row for _, turn in turns}
        data_plane = self._parts.data_plane
        errors: list[Exception | None] = [None] * len(turns)
        if len(rows) == len(turns):
            try:
                await data_plane.put(STAGING_PARTITION, rows)
                return errors
            except Exception:  # noqa: BLE001 - retried one by one below, which attributes it
                if len(turns) == 1:
                    raise
        for position, (_, turn) in enumerate(turns):
            try:
                await data_plane.put(STAGING_PARTITION, {turn.key: turn.row})
            except Exception as error:  # noqa: BLE001 - raised in the attempt that handed it
                errors[position] = error
        return errors

    async def _commit_one(
        self, request: AttemptRequest, turn: CommittedTurn
    ) -> TurnLogRecord | GateAttemptError:
        """Commit one staged turn in the ledger and record its episode state (in the cut)."""
        parts = self._parts
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
            return GateAttemptError(
                request.gate_rollout_id, FailureKind.INFRA, f"turn refused: {error}"
            )
        # Here, not after the caller's wait: a caller cancelled meanwhile (the run stops)
        # still had its turn committed, and its partial is no longer needed.
        parts.partials.turn_committed(request.gate_rollout_id, turn.turn_index)
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
            target_step=parts.ledger.borrowed_group(request.group_id).target_step,
            turn_index=partial.turn_index,
            token_ids=list(partial.token_ids),
            logprobs=list(partial.logprobs),
            weight_versions=list(partial.weight_versions),
            seed_id=partial.seed_id,
        )
        if parts.seal_journal.partial(record) is not None:
            parts.partials.record(record)
