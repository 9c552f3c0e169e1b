"""The per-group entries of RolloutParts and their transitions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pipeline_helpers import small_config

from rollvault.controller.loop.parts import (
    FinalizedGroup,
    GroupOrigin,
    GroupStage,
    GroupStateError,
    RolloutParts,
)
from rollvault.controller.loop.pipeline import build_parts
from rollvault.ledger.reward_penalties import FinalizedReward

ORIGIN = GroupOrigin(epoch=1, dataset_idx=7)
FINALIZED = FinalizedGroup(
    rewards=[FinalizedReward(raw_reward=1.0, reward=0.5, masked=False)],
    metrics={"reward_mean": 0.5},
    gate_rollout_ids=["g_g0_a1"],
)


def _parts(tmp_path: Path) -> RolloutParts:
    async def make() -> RolloutParts:
        return build_parts(small_config(tmp_path))

    return asyncio.run(make())


def test_a_group_is_reserved_pending_then_finalized_keeping_its_origin(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    parts.add_reserved_group("g", ORIGIN)
    assert parts.group("g").stage is GroupStage.PENDING
    parts.record_finalization("g", FINALIZED)
    entry = parts.group("g")
    assert entry.stage is GroupStage.FINALIZED
    assert entry.origin == ORIGIN
    assert entry.finalization() is FINALIZED
    assert parts.forget_group("g") == entry
    assert "g" not in parts.groups


@pytest.mark.parametrize(
    ("prepare", "act", "message"),
    [
        ([], lambda p: p.record_finalization("g", FINALIZED), "'g' cannot be finalized: it is un"),
        (["reserve", "finalize"], lambda p: p.record_finalization("g", FINALIZED), "already fin"),
        (["reserve"], lambda p: p.add_reserved_group("g", ORIGIN), "already pending"),
        (["reserve", "finalize"], lambda p: p.add_reserved_group("g", ORIGIN), "already finalized"),
        (["reserve"], lambda p: p.group("g").finalization(), "'g' is pending: it has no final"),
        ([], lambda p: p.forget_group("g"), "'g' cannot be forgotten: it is unknown"),
        ([], lambda p: p.group("g"), "'g' is unknown"),
    ],
)
def test_a_transition_the_stage_forbids_names_the_group_and_its_stage(
    tmp_path: Path, prepare: list[str], act: object, message: str
) -> None:
    parts = _parts(tmp_path)
    if "reserve" in prepare:
        parts.add_reserved_group("g", ORIGIN)
    if "finalize" in prepare:
        parts.record_finalization("g", FINALIZED)
    before = dict(parts.groups)
    with pytest.raises(GroupStateError, match=message):
        act(parts)  # type: ignore[operator]
    assert parts.groups == before


def test_load_groups_enters_canonical_groups_finalized_and_the_rest_pending(
    tmp_path: Path,
) -> None:
    parts = _parts(tmp_path)
    other = GroupOrigin(epoch=0, dataset_idx=3)
    parts.load_groups(
        {"done": ORIGIN, "open": other},
        rewards={"done": FINALIZED.rewards},
        metrics={"done": FINALIZED.metrics},
        gate_rollout_ids={"done": FINALIZED.gate_rollout_ids},
    )
    assert parts.group("done").finalization() == FINALIZED
    assert parts.group("done").origin == ORIGIN
    assert parts.group("open").stage is GroupStage.PENDING
    assert parts.group("open").origin == other


@pytest.mark.parametrize(
    ("origins", "rewards", "attempts", "message"),
    [
        ({}, {"g": []}, {"g": []}, "canonical group 'g' has no origin"),
        ({"g": ORIGIN}, {}, {"g": []}, "canonical group 'g' lacks its finalizer rewards"),
        ({"g": ORIGIN}, {"g": []}, {}, "group 'g' has finalizer rewards or metrics but no"),
    ],
)
def test_load_groups_refuses_maps_that_disagree_and_enters_nothing(
    tmp_path: Path,
    origins: dict[str, GroupOrigin],
    rewards: dict[str, list[FinalizedReward]],
    attempts: dict[str, list[str]],
    message: str,
) -> None:
    parts = _parts(tmp_path)
    with pytest.raises(GroupStateError, match=message):
        parts.load_groups(
            origins,
            rewards=rewards,
            metrics={g: {} for g in rewards},
            gate_rollout_ids=attempts,
        )
    assert parts.groups == {}


def test_load_groups_refuses_a_group_already_entered(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    parts.add_reserved_group("g", ORIGIN)
    with pytest.raises(GroupStateError, match="'g' cannot be restored: it is already pending"):
        parts.load_groups({"g": ORIGIN}, rewards={}, metrics={}, gate_rollout_ids={})
