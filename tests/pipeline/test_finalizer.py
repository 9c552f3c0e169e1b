"""The finalizer's checks, penalties and advantages, on hand-staged rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import dataset_of, small_config

from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.gate import staged_row_digest
from rollvault.controller.loop.parts import GroupOrigin, RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, staging_key, train_key
from rollvault.dataplane.rows import Row
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext

PROMPT = [5, 6, 7]
Sibling = tuple[Row, Row, float, bool]
"""(row put in the data plane, row the receipt's digest names, reward, format ok)"""


def _row(response: list[int], logprob: float = -0.5) -> Row:
    ids = np.array(PROMPT + response, dtype=np.int64)
    mask = np.array([0] * len(PROMPT) + [1] * len(response), dtype=np.int8)
    logprobs = np.array([0.0] * len(PROMPT) + [logprob] * len(response), dtype=np.float32)
    return {
        "input_ids": ids,
        "generation_logprobs": logprobs,
        "token_mask": mask,
        "prompt_length": 3,
    }


async def _finalize(parts: RolloutParts, siblings: list[Sibling]) -> tuple[str, dict[str, Row]]:
    """Stage (row put, row in receipt, reward, format ok) per sibling, seal, finalize."""
    cut = parts.cut
    async with cut.mutation():
        record = parts.ledger.reserve_group(
            cut,
            prompt_id="0",
            prompt_payload=parts.dataset[0],
            expected_generations=len(siblings),
            target_step=0,
            start_weight_version=0,
        )
        group_id = record.group_id
        parts.add_reserved_group(group_id, GroupOrigin(epoch=0, dataset_idx=0))
        parts.ledger.mark_group_dispatched(cut, group_id)
    for index, (stored, promised, reward, format_ok) in enumerate(siblings):
        rollout_id = record.gate_rollout_id(index)
        key = staging_key(rollout_id, 0)
        await parts.data_plane.put(STAGING_PARTITION, {key: stored})
        length = int(np.asarray(promised["token_mask"]).sum())
        async with cut.mutation():
            parts.ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=index,
                gate_rollout_id=rollout_id,
                receipt={
                    "gate_rollout_id": rollout_id,
                    "staging_keys": [key],
                    "row_digests": [{"length": length, "digest": staged_row_digest(promised)}],
                },
                reward=reward,
                mask_sample=False,
                reward_checks=RewardChecks(
                    overlong=False, format_ok=format_ok, finite_logprobs=True
                ),
                reward_log_context=RewardLogContext(response_length=length, stop_reason="stop"),
            )
    await Finalizer(parts, end_weight_version={}).finalize(group_id)
    rows = await parts.data_plane.get(
        TRAIN_PARTITION, [train_key(group_id, i) for i in range(len(siblings))]
    )
    return group_id, {key: dict(row) for key, row in rows.items()}


Finalized = tuple[RolloutParts, str, dict[str, Row]]


def _last_advantage(rows: dict[str, Row], group_id: str, index: int) -> float:
    """The advantage at the last token of sibling ``index``."""
    return float(np.asarray(rows[train_key(group_id, index)]["advantages"])[-1])


def _run(tmp_path: Path, siblings: list[Sibling], *overrides: str) -> Finalized:
    config = small_config(tmp_path, "reward.max_response_tokens=6", *overrides)

    async def main() -> Finalized:
        parts = build_parts(config, dataset=dataset_of(config))
        group_id, rows = await _finalize(parts, siblings)
        return parts, group_id, rows

    return asyncio.run(main())


def test_valid_siblings_get_group_relative_advantages_and_staging_is_cleared(
    tmp_path: Path,
) -> None:
    good = [(_row([1, 2]), _row([1, 2]), r, True) for r in (1.0, 0.0, 0.5)]
    parts, group_id, rows = _run(tmp_path, good, "reward.normalize_advantages_by_std=false")
    advantages = [_last_advantage(rows, group_id, i) for i in range(3)]
    assert advantages == pytest.approx([0.5, -0.5, 0.0])
    assert all(rows[train_key(group_id, i)]["sample_mask"] for i in range(3))
    # Prompt positions carry no advantage.
    assert np.asarray(rows[train_key(group_id, 0)]["advantages"])[:3].tolist() == [0.0, 0.0, 0.0]
    assert parts.data_plane.keys(STAGING_PARTITION) == []
    assert group_id not in parts.ledger and group_id in parts.replay


def test_a_row_that_is_not_the_one_the_receipt_names_becomes_a_masked_row(tmp_path: Path) -> None:
    siblings = [
        (_row([1, 2]), _row([1, 2]), 1.0, True),
        (_row([9, 9]), _row([1, 2]), 1.0, True),  # staged row differs from the digest
        (_row([3, 4]), _row([3, 4]), 0.0, True),
    ]
    _, group_id, rows = _run(tmp_path, siblings, "reward.normalize_advantages_by_std=false")
    tampered = rows[train_key(group_id, 1)]
    assert tampered["sample_mask"] is False
    assert not np.asarray(tampered["token_mask"]).any()
    # The masked sibling does not move the baseline of the two valid ones.
    assert _last_advantage(rows, group_id, 0) == pytest.approx(0.5)
    assert _last_advantage(rows, group_id, 2) == pytest.approx(-0.5)


def test_non_finite_logprobs_are_masked(tmp_path: Path) -> None:
    bad = _row([1, 2], logprob=float("nan"))
    siblings = [(bad, bad, 1.0, True), (_row([1, 2]), _row([1, 2]), 0.0, True)]
    _, group_id, rows = _run(tmp_path, siblings)
    masked = rows[train_key(group_id, 0)]
    assert masked["sample_mask"] is False
    assert np.isfinite(np.asarray(masked["generation_logprobs"])).all()


def test_overlong_is_masked_or_penalized_by_configuration(tmp_path: Path) -> None:
    long = _row([1, 2, 3, 4, 5, 6])  # 6 tokens reach reward.max_response_tokens=6
    siblings = [(long, long, 1.0, True), (_row([1]), _row([1]), 1.0, True)]
    _, group_id, rows = _run(tmp_path / "mask", siblings)
    assert rows[train_key(group_id, 0)]["sample_mask"] is False
    _, group_id, rows = _run(
        tmp_path / "penalty", siblings, "reward.mask_overlong=false", "reward.overlong_penalty=0.25"
    )
    assert rows[train_key(group_id, 0)]["sample_mask"] is True
    assert rows[train_key(group_id, 0)]["reward"] == pytest.approx(0.75)


def test_a_failed_format_check_costs_the_format_penalty(tmp_path: Path) -> None:
    siblings = [(_row([1]), _row([1]), 1.0, False), (_row([2]), _row([2]), 1.0, True)]
    _, group_id, rows = _run(tmp_path, siblings, "reward.format_penalty=0.4")
    assert rows[train_key(group_id, 0)]["reward"] == pytest.approx(0.6)
    assert rows[train_key(group_id, 1)]["reward"] == pytest.approx(1.0)


def test_the_gates_verdict_reaches_the_canonical_row_when_it_gave_one(tmp_path: Path) -> None:
    right, wrong, unsaid = _row([1, 2]), _row([3, 4]), _row([5, 6])
    right["correct"], wrong["correct"] = True, False
    siblings = [(right, right, 1.0, True), (wrong, wrong, 0.0, True), (unsaid, unsaid, 0.5, True)]
    _, group_id, rows = _run(tmp_path, siblings)
    verdicts = [rows[train_key(group_id, i)].get("correct") for i in range(3)]
    # A sibling staged without a verdict (an environment that does not say, a row of an
    # older snapshot) has none in its canonical row: the trainer leaves it out.
    assert verdicts == [True, False, None]
    assert type(verdicts[0]) is bool


def test_a_verdict_changed_after_staging_fails_the_digest(tmp_path: Path) -> None:
    staged, promised = _row([1, 2]), _row([1, 2])
    staged["correct"], promised["correct"] = True, False
    siblings = [(staged, promised, 1.0, True), (_row([3]), _row([3]), 0.0, True)]
    _, group_id, rows = _run(tmp_path, siblings)
    tampered = rows[train_key(group_id, 0)]
    assert tampered["sample_mask"] is False and "correct" not in tampered
