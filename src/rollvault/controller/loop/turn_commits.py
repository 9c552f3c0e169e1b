"""The rollout pump's turn sink: each finished turn of an attempt, committed in one mutation.

Staging the turn's row, committing the turn in the ledger (fenced by the
attempt id) and recording the episode's state (:mod:`.episodes`) happen in
one mutation section, so a snapshot sees a turn wholly committed or not at all.
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
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.ledger.errors import LedgerError

__all__ = ["TurnCommitter"]


class TurnCommitter:
    """Stages, commits and records each turn an attempt hands over (see the module docstring)."""

    def __init__(self, parts: RolloutParts) -> None:
        self._parts = parts
        self.turns_committed = 0

    async def commit_turn(self, request: AttemptRequest, turn: CommittedTurn) -> None:
        parts = self._parts
        key = logical_id(request.group_id, request.generation_index)
        async with parts.cut.mutation():
            await parts.data_plane.put(STAGING_PARTITION, {turn.key: turn.row})
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
                raise GateAttemptError(
                    request.gate_rollout_id, FailureKind.INFRA, f"turn refused: {error}"
                ) from error
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
            parts.logs.turns.write(
                TurnLogRecord(
                    gate_rollout_id=request.gate_rollout_id,
                    group_id=request.group_id,
                    generation_index=request.generation_index,
                    turn_index=turn.turn_index,
                    staging_key=turn.key,
                    num_tokens=int(np.asarray(turn.row["token_mask"]).sum()),
                    incarnation=parts.logs.incarnation,
                )
            )
            self.turns_committed += 1
        parts.partials.turn_committed(request.gate_rollout_id, turn.turn_index)

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
