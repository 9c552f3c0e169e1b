"""The turn committer commits the turns one loop turn hands over in one mutation section."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import dataset_of, small_config

from rollvault.controller.loop.gate import (
    AttemptRequest,
    CommittedTurn,
    GateAttemptError,
)
from rollvault.controller.loop.parts import GroupOrigin, RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.loop.run_logs import TURNS_LOG_FILENAME, TurnLogRecord, read_jsonl
from rollvault.controller.loop.turn_commits import TurnCommitter
from rollvault.dataplane.interface import STAGING_PARTITION, staging_key
from rollvault.dataplane.rows import Row
from rollvault.tasks.episodes import RestoreClass

SIBLINGS = 4


def _row(tokens: int) -> Row:
    return {
        "input_ids": np.arange(3 + tokens, dtype=np.int64),
        "generation_logprobs": np.zeros(3 + tokens, dtype=np.float32),
        "token_mask": np.array([0, 0, 0] + [1] * tokens, dtype=np.int8),
        "done": True,
    }


async def _group(parts: RolloutParts) -> list[AttemptRequest]:
    """A dispatched group of ``SIBLINGS`` siblings; one request per sibling."""
    cut = parts.cut
    async with cut.mutation():
        record = parts.ledger.reserve_group(
            cut,
            prompt_id="0",
            prompt_payload=parts.dataset[0],
            expected_generations=SIBLINGS,
            target_step=0,
            start_weight_version=0,
        )
        parts.add_reserved_group(record.group_id, GroupOrigin(epoch=0, dataset_idx=0))
        parts.ledger.mark_group_dispatched(cut, record.group_id)
    return [
        AttemptRequest(
            group_id=record.group_id,
            generation_index=index,
            gate_rollout_id=record.gate_rollout_id(index),
            prompt={},
            weight_version=0,
        )
        for index in range(SIBLINGS)
    ]


def _turn(request: AttemptRequest, tokens: int) -> CommittedTurn:
    return CommittedTurn(
        turn_index=0,
        key=staging_key(request.gate_rollout_id, 0),
        row=_row(tokens),
        reward=1.0,
        restore_class=RestoreClass.RESTART_ONLY,
        env_state=None,
    )


def test_a_generation_batch_s_turns_commit_together_and_a_refused_one_fails_alone(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path)

    async def main() -> tuple[list[BaseException | None], TurnCommitter, RolloutParts, int]:
        parts = build_parts(config, dataset=dataset_of(config))
        requests = await _group(parts)
        # Sibling 2's turn names an attempt the ledger does not know (superseded).
        stale = AttemptRequest(
            group_id=requests[2].group_id,
            generation_index=2,
            gate_rollout_id=requests[2].gate_rollout_id[:-4] + "beef",
            prompt={},
            weight_version=0,
        )
        handed = [requests[0], requests[1], stale, requests[3]]
        committer = TurnCommitter(parts)
        before = parts.cut.mutation_version
        results = await asyncio.gather(
            *(committer.commit_turn(r, _turn(r, i + 1)) for i, r in enumerate(handed)),
            return_exceptions=True,
        )
        return list(results), committer, parts, parts.cut.mutation_version - before

    results, committer, parts, sections = asyncio.run(main())
    assert results[0] is None and results[1] is None and results[3] is None
    assert isinstance(results[2], GateAttemptError) and "turn refused" in str(results[2])
    assert committer.batches == 1 and committer.turns_committed == 3
    assert sections == 1  # one outer mutation section for the whole batch (the put nests)
    group = parts.ledger.get_group(results_group(parts))
    assert [len(s.current_attempt.turn_keys) for s in group.siblings] == [1, 1, 0, 1]
    # The refused turn's row did not stay behind; the others are staged.
    stale_key = staging_key(group.gate_rollout_id(2)[:-4] + "beef", 0)
    assert not parts.data_plane.has(STAGING_PARTITION, stale_key)
    for index in (0, 1, 3):
        assert parts.data_plane.has(STAGING_PARTITION, staging_key(group.gate_rollout_id(index), 0))
    lines = read_jsonl(Path(config.logging.log_dir) / TURNS_LOG_FILENAME, TurnLogRecord)
    assert [(line.generation_index, line.num_tokens) for line in lines] == [(0, 1), (1, 2), (3, 4)]


def results_group(parts: RolloutParts) -> str:
    (group_id,) = parts.ledger.group_ids()
    return group_id


def test_a_caller_inside_a_mutation_section_commits_directly(tmp_path: Path) -> None:
    config = small_config(tmp_path)

    async def main() -> tuple[TurnCommitter, RolloutParts]:
        parts = build_parts(config, dataset=dataset_of(config))
        requests = await _group(parts)
        committer = TurnCommitter(parts)
        async with parts.cut.mutation():
            # A batch task would wait for the cut this caller holds: no deadlock here.
            await asyncio.wait_for(committer.commit_turn(requests[0], _turn(requests[0], 2)), 5)
            stale = AttemptRequest(
                group_id=requests[1].group_id,
                generation_index=1,
                gate_rollout_id=requests[1].gate_rollout_id[:-4] + "beef",
                prompt={},
                weight_version=0,
            )
            with pytest.raises(GateAttemptError):
                await committer.commit_turn(stale, _turn(stale, 1))
        return committer, parts

    committer, parts = asyncio.run(main())
    assert committer.turns_committed == 1
    assert parts.data_plane.has(
        STAGING_PARTITION,
        staging_key(parts.ledger.get_group(results_group(parts)).gate_rollout_id(0), 0),
    )
