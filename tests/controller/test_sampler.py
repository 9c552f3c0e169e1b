"""Sampler: in_order stamps and lookahead, windowed staleness, the persisted cursor."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.config.schema import SamplerConfig, SamplerKind
from rollvault.controller.data.sampler import (
    InOrderSampler,
    Sampler,
    SamplerAdmissionError,
    SamplerState,
    SamplerStateError,
    WindowedSampler,
    build_sampler,
)


def admit_all(sampler: InOrderSampler, count: int, *, trainer_version: int) -> list[int]:
    return [sampler.admit(epoch=0, trainer_version=trainer_version) for _ in range(count)]


def test_kth_stamp_gets_step_k_div_batch() -> None:
    sampler = InOrderSampler(num_prompts_per_step=3, max_lookahead_versions=10)
    assert admit_all(sampler, 8, trainer_version=0) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert sampler.next_stamp_index == 8
    assert sampler.next_target_step == 2


@settings(max_examples=50, deadline=None)
@given(
    per_step=st.integers(1, 8),
    lookahead=st.integers(0, 3),
    trainer_version=st.integers(0, 5),
)
def test_admission_stops_exactly_at_the_lookahead(
    per_step: int, lookahead: int, trainer_version: int
) -> None:
    sampler = InOrderSampler(per_step, lookahead)
    admitted: list[int] = []
    while sampler.ready_to_admit(trainer_version):
        admitted.append(sampler.admit(epoch=0, trainer_version=trainer_version))
    # Every step up to trainer_version + lookahead is fully stamped, none beyond.
    assert admitted == [k // per_step for k in range((trainer_version + lookahead + 1) * per_step)]
    assert max(admitted) == trainer_version + lookahead


def test_admission_beyond_lookahead_is_refused_and_changes_nothing() -> None:
    sampler = InOrderSampler(num_prompts_per_step=2, max_lookahead_versions=1)
    admit_all(sampler, 4, trainer_version=0)  # steps 0 and 1
    before = sampler.state_dict()
    assert not sampler.ready_to_admit(0)
    with pytest.raises(SamplerAdmissionError, match="step 2 is beyond trainer_version 0"):
        sampler.admit(epoch=0, trainer_version=0)
    assert sampler.state_dict() == before
    # One optimizer step later, step 2 opens.
    assert sampler.ready_to_admit(1)
    assert sampler.admit(epoch=0, trainer_version=1) == 2


def test_admissible_rule() -> None:
    sampler = InOrderSampler(num_prompts_per_step=4, max_lookahead_versions=2)
    assert sampler.admissible(5, trainer_version=3)
    assert not sampler.admissible(6, trainer_version=3)
    zero = InOrderSampler(num_prompts_per_step=4, max_lookahead_versions=0)
    assert zero.admissible(3, trainer_version=3)
    assert not zero.admissible(4, trainer_version=3)


def test_replacement_takes_the_dropped_groups_step_without_a_new_slot() -> None:
    sampler = InOrderSampler(num_prompts_per_step=2, max_lookahead_versions=1)
    admit_all(sampler, 3, trainer_version=0)  # steps 0, 0, 1
    assert sampler.restamp(0, epoch=1, trainer_version=0) == 0
    assert sampler.next_stamp_index == 3
    assert sampler.sampler_dispatch_index == 4
    assert sampler.epoch == 1
    # The next fresh group still gets the next slot.
    assert sampler.admit(epoch=1, trainer_version=0) == 1


@pytest.mark.parametrize(
    ("target_step", "trainer_version", "fragment"),
    [
        (2, 1, "never handed out"),
        (None, 0, "never handed out"),
        (-1, 0, "never handed out"),
        (0, 1, "already trained"),
    ],
)
def test_restamp_refuses_steps_it_cannot_reuse(
    target_step: int | None, trainer_version: int, fragment: str
) -> None:
    sampler = InOrderSampler(num_prompts_per_step=2, max_lookahead_versions=1)
    admit_all(sampler, 3, trainer_version=0)
    before = sampler.state_dict()
    with pytest.raises(SamplerAdmissionError, match=fragment):
        sampler.restamp(target_step, epoch=0, trainer_version=trainer_version)
    assert sampler.state_dict() == before


def test_epoch_is_the_highest_dispatched() -> None:
    sampler = InOrderSampler(num_prompts_per_step=2, max_lookahead_versions=5)
    sampler.admit(epoch=2, trainer_version=0)
    sampler.admit(epoch=1, trainer_version=0)  # e.g. an older spare
    assert sampler.epoch == 2


def test_negative_arguments_are_rejected() -> None:
    sampler = InOrderSampler(num_prompts_per_step=2, max_lookahead_versions=1)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        sampler.admit(epoch=-1, trainer_version=0)
    with pytest.raises(ValueError, match="num_prompts_per_step"):
        InOrderSampler(num_prompts_per_step=0, max_lookahead_versions=1)
    with pytest.raises(ValueError, match="max_lookahead_versions"):
        InOrderSampler(num_prompts_per_step=1, max_lookahead_versions=-1)


def test_cursor_covers_exactly_the_stamped_steps() -> None:
    sampler = InOrderSampler(num_prompts_per_step=4, max_lookahead_versions=5)
    admit_all(sampler, 5, trainer_version=0)  # step 0 full, step 1 partly stamped
    sampler.check_cursor_covers([0, 1, None, 1])
    assert sampler.covers(1) and not sampler.covers(2)
    with pytest.raises(SamplerStateError, match="restored target step 2 is not covered"):
        sampler.check_cursor_covers([0, 2])


def test_in_order_state_round_trips_through_json() -> None:
    sampler = InOrderSampler(num_prompts_per_step=3, max_lookahead_versions=2)
    admit_all(sampler, 5, trainer_version=0)
    sampler.restamp(1, epoch=0, trainer_version=0)
    encoded = msgspec.json.encode(sampler.state_dict())

    resumed = InOrderSampler(num_prompts_per_step=3, max_lookahead_versions=2)
    resumed.load_state_dict(msgspec.json.decode(encoded, type=SamplerState))
    assert resumed.state_dict() == sampler.state_dict()
    assert resumed.admit(epoch=0, trainer_version=0) == sampler.admit(epoch=0, trainer_version=0)


def test_state_dict_is_a_snapshot_not_a_view() -> None:
    sampler = InOrderSampler(num_prompts_per_step=3, max_lookahead_versions=2)
    state = sampler.state_dict()
    sampler.admit(epoch=0, trainer_version=0)
    assert state.next_stamp_index == 0 and state.sampler_dispatch_index == 0


def test_state_of_the_other_kind_is_rejected() -> None:
    windowed_state = WindowedSampler(1).state_dict()
    with pytest.raises(SamplerStateError, match="kind is 'windowed'.*sampler is 'in_order'"):
        InOrderSampler(2, 1).load_state_dict(windowed_state)
    with pytest.raises(SamplerStateError, match="kind is 'in_order'"):
        WindowedSampler(1).load_state_dict(InOrderSampler(2, 1).state_dict())


def test_inconsistent_counters_are_rejected_without_change() -> None:
    sampler = InOrderSampler(2, 1)
    sampler.admit(epoch=0, trainer_version=0)
    before = sampler.state_dict()
    bad = SamplerState(
        kind=SamplerKind.IN_ORDER, epoch=0, sampler_dispatch_index=2, next_stamp_index=3
    )
    with pytest.raises(SamplerStateError, match="next_stamp_index \\(3\\) exceeds"):
        sampler.load_state_dict(bad)
    assert sampler.state_dict() == before
    stamped_windowed = SamplerState(
        kind=SamplerKind.WINDOWED, epoch=0, sampler_dispatch_index=2, next_stamp_index=1
    )
    with pytest.raises(SamplerStateError, match="must be 0"):
        WindowedSampler(1).load_state_dict(stamped_windowed)


def test_decoding_a_bad_state_names_the_field() -> None:
    raw = b'{"kind": "in_order", "epoch": 0, "sampler_dispatch_index": -2, "next_stamp_index": 0}'
    with pytest.raises(msgspec.ValidationError, match=r"\$\.sampler_dispatch_index"):
        msgspec.json.decode(raw, type=SamplerState)
    raw = b'{"kind": "random", "epoch": 0, "sampler_dispatch_index": 0, "next_stamp_index": 0}'
    with pytest.raises(msgspec.ValidationError, match=r"\$\.kind"):
        msgspec.json.decode(raw, type=SamplerState)


@pytest.mark.parametrize(
    ("start", "trainer", "expected"),
    [(5, 5, True), (4, 5, True), (3, 5, False), (0, 0, True)],
)
def test_windowed_staleness_rule(start: int, trainer: int, expected: bool) -> None:
    assert WindowedSampler(max_staleness_versions=1).trainable(start, trainer) is expected


def test_windowed_zero_staleness_is_on_policy() -> None:
    sampler = WindowedSampler(max_staleness_versions=0)
    assert sampler.trainable(7, 7)
    assert not sampler.trainable(6, 7)


def test_windowed_rejects_weights_from_the_future() -> None:
    with pytest.raises(ValueError, match="ahead of trainer_version"):
        WindowedSampler(1).trainable(start_weight_version=4, trainer_version=3)


def test_windowed_never_stamps_and_never_blocks() -> None:
    # Seen as the pumps see it, through the protocol, whose admit may return a step.
    sampler: Sampler = WindowedSampler(max_staleness_versions=2)
    assert not sampler.stamps_target_steps
    assert all(sampler.ready_to_admit(0) for _ in range(3))
    assert sampler.admit(epoch=0, trainer_version=0) is None
    assert sampler.restamp(None, epoch=1, trainer_version=0) is None
    assert sampler.sampler_dispatch_index == 2
    assert sampler.state_dict().next_stamp_index == 0
    with pytest.raises(SamplerAdmissionError, match="never stamps"):
        sampler.restamp(3, epoch=0, trainer_version=0)
    sampler.check_cursor_covers([None, None])
    with pytest.raises(SamplerStateError, match=r"target steps \[1, 4\]"):
        sampler.check_cursor_covers([4, None, 1])


def test_build_sampler_follows_config() -> None:
    in_order = build_sampler(SamplerConfig(max_lookahead_versions=0), num_prompts_per_step=2)
    assert isinstance(in_order, InOrderSampler)
    assert in_order.stamps_target_steps
    assert [in_order.admit(epoch=0, trainer_version=0) for _ in range(2)] == [0, 0]
    assert not in_order.ready_to_admit(0)
    windowed = build_sampler(
        SamplerConfig(kind=SamplerKind.WINDOWED, max_staleness_versions=3), num_prompts_per_step=2
    )
    assert isinstance(windowed, WindowedSampler)
    assert windowed.max_staleness_versions == 3
