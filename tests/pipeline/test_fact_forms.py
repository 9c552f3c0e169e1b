"""Fact segment form 2 (msgpack, issue 16): what goes in comes back exactly (rewards as the
same doubles, gate rollout ids derived or kept), at a fraction of form 1's bytes, and bytes
whose pieces disagree are refused naming the fact."""

from __future__ import annotations

import math
import uuid

import msgspec
import pytest

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.snapshots.fact_forms import (
    FactFormError,
    FinalizedFact,
    OriginFact,
    PackedFinalized,
    ReplayFact,
    decode_fact_segment,
    encode_fact_segment,
    encode_json_fact_segment,
)
from rollvault.ledger.reward_penalties import FinalizedReward

GROUP = "189bc5c6f98a46249273c65cf967c560"


def _finalized(siblings: int = 16, *, ids: list[str] | None = None) -> FinalizedFact:
    rewards = [
        FinalizedReward(raw_reward=(n + 1) / 7, reward=(n + 1) / 7, masked=False)
        for n in range(siblings)
    ]
    gate_ids = ids or [f"{GROUP}_g{n}_a{uuid.uuid4().hex}" for n in range(siblings)]
    return FinalizedFact(
        GROUP, rewards, {"invalid": 0.0, "masked": 0.0, "reward_mean": 0.5}, gate_ids
    )


def _round_trip(facts: list[OriginFact | FinalizedFact | ReplayFact]) -> list[object]:
    return list(decode_fact_segment(encode_fact_segment(facts), form=2))


def test_every_kind_comes_back_equal() -> None:
    facts: list[OriginFact | FinalizedFact | ReplayFact] = [
        OriginFact(GROUP, 1, 518, "6c56" * 16),
        OriginFact("g-other", 0, 3, None),
        _finalized(),
        ReplayFact.of(ReplayEntry(GROUP, "518", 1, 2, 3, 4)),
        ReplayFact.of(ReplayEntry("g-other", "3", 0, 0, 0, None)),
    ]
    assert _round_trip(facts) == facts
    replay = facts[3]
    assert isinstance(replay, ReplayFact)
    assert replay.entry() == ReplayEntry(GROUP, "518", 1, 2, 3, 4)


def test_rewards_come_back_as_the_same_doubles_and_penalties_and_masks_are_kept() -> None:
    awkward = [0.1 + 0.2, -0.0, 5e-324, 1.7976931348623157e308, -1 / 3]
    rewards = [FinalizedReward(raw_reward=r, reward=r, masked=False) for r in awkward] + [
        FinalizedReward(raw_reward=0.25, reward=-1.0, masked=True)
    ]
    fact = FinalizedFact(GROUP, rewards, {"m": -0.0}, [f"{GROUP}_g{n}_a{n:032x}" for n in range(6)])
    (back,) = _round_trip([fact])
    assert back == fact
    assert isinstance(back, FinalizedFact)
    for got, want in zip(back.rewards, rewards, strict=True):
        assert math.copysign(1.0, got.raw_reward) == math.copysign(1.0, want.raw_reward)
        assert got.raw_reward.hex() == want.raw_reward.hex()
    # -0.0 == 0.0, but a reward of -0.0 after a raw 0.0 is not "the same": it is written.
    signed = FinalizedFact(
        GROUP,
        [FinalizedReward(raw_reward=0.0, reward=-0.0, masked=False)],
        {},
        [f"{GROUP}_g0_a{0:032x}"],
    )
    (back,) = _round_trip([signed])
    assert isinstance(back, FinalizedFact)
    assert math.copysign(1.0, back.rewards[0].reward) == -1.0


def test_gate_rollout_ids_not_derived_from_the_group_are_kept_as_they_are() -> None:
    derived = _finalized(2)
    odd = _finalized(3, ids=[f"{GROUP}_g0_a{'A' * 32}", f"{GROUP}_g1_a{0:032x}", "elsewhere-7"])
    packed = msgspec.msgpack.decode(encode_fact_segment([derived, odd]))
    assert isinstance(packed[1][0][6], bytes) and len(packed[1][0][6]) == 2 * 16
    assert packed[1][1][6] == odd.gate_rollout_ids
    assert _round_trip([derived, odd]) == [derived, odd]


def test_form_2_is_a_fraction_of_form_1() -> None:
    origin = OriginFact(GROUP, 0, 518, "6c56bd1a" * 8)
    fact = _finalized()
    json_bytes = len(encode_json_fact_segment([origin, fact]))
    packed_bytes = len(encode_fact_segment([origin, fact]))
    assert packed_bytes * 3 < json_bytes, (packed_bytes, json_bytes)


def _packed_segment(fact: PackedFinalized) -> bytes:
    return msgspec.msgpack.encode([2, [fact]])


@pytest.mark.parametrize(
    ("fact", "problem"),
    [
        (
            PackedFinalized(GROUP, b"\0" * 12, None, [], {}, b""),
            "$.facts[0].raw_rewards: 12 bytes, not a whole number of float64s",
        ),
        (
            PackedFinalized(GROUP, b"\0" * 16, b"\0" * 8, [], {}, b"\0" * 32),
            "$.facts[0].rewards: 1 rewards for 2 raw rewards",
        ),
        (
            PackedFinalized(GROUP, b"\0" * 16, None, [2], {}, b"\0" * 32),
            "$.facts[0].masked: not ascending sibling indices below 2",
        ),
        (
            PackedFinalized(GROUP, b"\0" * 16, None, [1, 0], {}, b"\0" * 32),
            "$.facts[0].masked: not ascending sibling indices below 2",
        ),
        (
            PackedFinalized(GROUP, b"\0" * 16, None, [], {}, b"\0" * 16),
            "$.facts[0].attempts: 1 attempts for 2 rewards",
        ),
        (
            PackedFinalized(GROUP, b"\0" * 16, None, [], {}, b"\0" * 20),
            "$.facts[0].attempts: 20 bytes, not a whole number of UUIDs",
        ),
    ],
)
def test_a_finalization_whose_pieces_disagree_is_refused(
    fact: PackedFinalized, problem: str
) -> None:
    with pytest.raises(FactFormError) as caught:
        decode_fact_segment(_packed_segment(fact), form=2)
    assert str(caught.value) == problem


def test_unknown_tags_extra_fields_and_another_format_are_refused() -> None:
    good = msgspec.msgpack.decode(encode_fact_segment([OriginFact(GROUP, 0, 1, None)]))
    for bad, problem in (
        ([2, [[9, GROUP, 0, 1, None]]], "Invalid value 9"),
        ([2, [[1, GROUP, 0, 1, None, "extra"]]], "got 5 - at `$[1][0]`"),
        ([3, good[1]], "unsupported fact_segment_format 3"),
    ):
        with pytest.raises(FactFormError) as caught:
            decode_fact_segment(msgspec.msgpack.encode(bad), form=2)
        assert problem in str(caught.value)
    # A form 1 (JSON) segment's bytes under a form 2 name are not read as one.
    with pytest.raises(FactFormError):
        decode_fact_segment(encode_json_fact_segment([OriginFact(GROUP, 0, 1, None)]), form=2)
