"""Batch shortfall floor rule and the spare-prompt reserve."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.controller.data.shortfall import (
    SHORTFALL_SCHEMA_VERSION,
    SPARE_PROMPTS_SCHEMA_VERSION,
    BatchShortfall,
    BatchShortfallState,
    ShortfallError,
    SparePrompt,
    SparePrompts,
    SparePromptsError,
    SparePromptsState,
    step_floor,
)


@pytest.mark.parametrize(
    ("per_step", "fraction", "floor"),
    [(8, 0.5, 4), (8, 1.0, 8), (7, 0.5, 4), (10, 0.3, 3), (10, 0.7, 7), (3, 0.01, 1), (1, 0.5, 1)],
)
def test_floor_is_ceil_of_fraction(per_step: int, fraction: float, floor: int) -> None:
    assert step_floor(per_step, fraction) == floor


@pytest.mark.parametrize(("per_step", "fraction"), [(0, 0.5), (8, 0.0), (8, 1.5), (8, -0.1)])
def test_floor_rejects_bad_arguments(per_step: int, fraction: float) -> None:
    with pytest.raises(ShortfallError):
        step_floor(per_step, fraction)


def test_shrinking_stops_at_the_floor() -> None:
    shortfall = BatchShortfall()
    # 8 per step at 0.5: the step may lose 4 groups and train on 4, never fewer.
    assert shortfall.required_groups(3, 8, 0.5) == 8
    losses = 0
    while shortfall.can_shrink(3, 8, 0.5):
        shortfall.record_loss(3)
        losses += 1
    assert losses == 4
    assert shortfall.required_groups(3, 8, 0.5) == 4
    assert shortfall.lost(3) == 4
    # Other steps are untouched.
    assert shortfall.required_groups(2, 8, 0.5) == 8
    assert shortfall.can_shrink(2, 8, 0.5)


def test_loss_recorded_past_the_floor_still_requires_the_floor() -> None:
    shortfall = BatchShortfall()
    for _ in range(6):
        shortfall.record_loss(0)
    # The controller should have replaced the last two; the step still needs its floor.
    assert shortfall.required_groups(0, 8, 0.5) == 4
    assert not shortfall.can_shrink(0, 8, 0.5)


def test_full_fraction_never_shrinks() -> None:
    assert not BatchShortfall().can_shrink(0, 8, 1.0)


@settings(max_examples=80, deadline=None)
@given(per_step=st.integers(1, 64), fraction=st.floats(0.001, 1.0), losses=st.integers(0, 80))
def test_floor_rule_holds_for_any_shape(per_step: int, fraction: float, losses: int) -> None:
    shortfall = BatchShortfall()
    for _ in range(losses):
        if not shortfall.can_shrink(0, per_step, fraction):
            break
        shortfall.record_loss(0)
    floor = step_floor(per_step, fraction)
    required = shortfall.required_groups(0, per_step, fraction)
    assert floor <= required <= per_step
    assert floor >= 1
    assert required == per_step - shortfall.lost(0)
    assert shortfall.lost(0) == min(losses, per_step - floor)


def test_record_loss_counts_and_rejects_negative_steps() -> None:
    shortfall = BatchShortfall()
    assert shortfall.record_loss(5) == 1
    assert shortfall.record_loss(5) == 2
    assert shortfall.record_loss(1) == 1
    assert shortfall.total_lost == 3
    with pytest.raises(ShortfallError, match="step must be >= 0"):
        shortfall.record_loss(-1)


def test_shortfall_state_round_trips_and_as_dict_is_a_copy() -> None:
    shortfall = BatchShortfall()
    for step in (3, 3, 7):
        shortfall.record_loss(step)
    as_dict = shortfall.as_dict()
    as_dict[3] = 100
    assert shortfall.lost(3) == 2
    encoded = msgspec.json.encode(shortfall.state_dict())
    restored = BatchShortfall()
    restored.load_state_dict(msgspec.json.decode(encoded, type=BatchShortfallState))
    assert restored.as_dict() == {3: 2, 7: 1}


def test_shortfall_state_dict_does_not_alias() -> None:
    shortfall = BatchShortfall()
    shortfall.record_loss(1)
    state = shortfall.state_dict()
    shortfall.record_loss(1)
    assert state.losses == {1: 1}


@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        (BatchShortfallState(schema_version=99, losses={}), "schema_version 99"),
        (BatchShortfallState(schema_version=SHORTFALL_SCHEMA_VERSION, losses={1: 0}), ">= 1"),
        (BatchShortfallState(schema_version=SHORTFALL_SCHEMA_VERSION, losses={-2: 1}), ">= 0"),
    ],
)
def test_bad_shortfall_state_is_rejected(state: BatchShortfallState, fragment: str) -> None:
    shortfall = BatchShortfall()
    with pytest.raises(ShortfallError, match=fragment):
        shortfall.load_state_dict(state)
    assert shortfall.as_dict() == {}


def test_shortfall_load_into_non_empty_is_refused() -> None:
    shortfall = BatchShortfall()
    shortfall.record_loss(0)
    with pytest.raises(ShortfallError, match="already recorded"):
        shortfall.load_state_dict(BatchShortfallState(schema_version=1, losses={2: 1}))
    assert shortfall.as_dict() == {0: 1}


def test_decoding_a_bad_shortfall_key_names_it() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.losses"):
        msgspec.json.decode(b'{"schema_version":1,"losses":{"x":1}}', type=BatchShortfallState)


def test_spares_are_first_in_first_out() -> None:
    spares = SparePrompts()
    for pair in [(0, 5), (0, 9), (1, 2)]:
        spares.push(*pair)
    assert len(spares) == 3
    assert list(spares) == [(0, 5), (0, 9), (1, 2)]
    assert spares.pop() == (0, 5)
    assert spares.pop() == (0, 9)
    assert len(spares) == 1


def test_popping_an_empty_reserve_is_an_error() -> None:
    with pytest.raises(SparePromptsError, match="empty"):
        SparePrompts().pop()


def test_refill_count_tops_up_to_the_target() -> None:
    spares = SparePrompts()
    assert spares.refill_count(2) == 2
    spares.push(0, 1)
    assert spares.refill_count(2) == 1
    spares.push(0, 2)
    spares.push(0, 3)
    assert spares.refill_count(2) == 0


def test_same_prompt_cannot_be_held_twice_but_can_after_pop() -> None:
    spares = SparePrompts()
    spares.push(0, 4)
    with pytest.raises(SparePromptsError, match="already held"):
        spares.push(0, 4)
    spares.push(1, 4)  # same index, next epoch: a different draw
    assert spares.pop() == (0, 4)
    spares.push(0, 4)
    assert list(spares) == [(1, 4), (0, 4)]


def test_negative_spare_is_rejected() -> None:
    with pytest.raises(SparePromptsError, match=">= 0"):
        SparePrompts().push(0, -1)


def test_drain_empties_in_order() -> None:
    spares = SparePrompts()
    spares.push(0, 1)
    spares.push(0, 2)
    assert spares.drain() == [(0, 1), (0, 2)]
    assert len(spares) == 0
    spares.push(0, 1)  # no longer held
    assert list(spares) == [(0, 1)]


def test_spares_round_trip_through_json() -> None:
    spares = SparePrompts()
    for pair in [(2, 7), (2, 0), (3, 7)]:
        spares.push(*pair)
    encoded = msgspec.json.encode(spares.state_dict())
    restored = SparePrompts()
    restored.load_state_dict(msgspec.json.decode(encoded, type=SparePromptsState))
    assert list(restored) == [(2, 7), (2, 0), (3, 7)]
    with pytest.raises(SparePromptsError, match="already held"):
        restored.push(2, 0)


def test_spares_state_dict_does_not_alias() -> None:
    spares = SparePrompts()
    spares.push(0, 1)
    state = spares.state_dict()
    spares.pop()
    spares.push(0, 2)
    assert state.prompts == (SparePrompt(epoch=0, dataset_idx=1),)


def test_spares_state_with_duplicates_is_rejected_naming_positions() -> None:
    state = SparePromptsState(
        schema_version=SPARE_PROMPTS_SCHEMA_VERSION,
        prompts=(SparePrompt(0, 1), SparePrompt(0, 2), SparePrompt(0, 1)),
    )
    spares = SparePrompts()
    with pytest.raises(
        SparePromptsError, match=r"prompts\[2\]: duplicate .* first at prompts\[0\]"
    ):
        spares.load_state_dict(state)
    assert len(spares) == 0


@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        (SparePromptsState(schema_version=0, prompts=()), "schema_version 0"),
        (
            SparePromptsState(
                schema_version=SPARE_PROMPTS_SCHEMA_VERSION, prompts=(SparePrompt(-1, 0),)
            ),
            r"\$\.prompts\[0\]\.epoch",
        ),
    ],
)
def test_bad_spares_state_is_rejected(state: SparePromptsState, fragment: str) -> None:
    with pytest.raises(SparePromptsError, match=fragment):
        SparePrompts().load_state_dict(state)


def test_spares_load_into_non_empty_is_refused() -> None:
    spares = SparePrompts()
    spares.push(0, 0)
    with pytest.raises(SparePromptsError, match="already holds 1 prompts"):
        spares.load_state_dict(SparePromptsState(schema_version=1, prompts=()))


def test_decoding_a_bad_spare_names_the_field() -> None:
    raw = b'{"schema_version":1,"prompts":[{"epoch":0,"dataset_idx":1},{"epoch":0}]}'
    with pytest.raises(msgspec.ValidationError, match=r"dataset_idx.*\$\.prompts\[1\]"):
        msgspec.json.decode(raw, type=SparePromptsState)
