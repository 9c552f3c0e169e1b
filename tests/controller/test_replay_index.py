"""Replay buffer index: take-by-step, take-by-window, strict state round trip."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollvault.controller.data.replay_index import (
    REPLAY_INDEX_SCHEMA_VERSION,
    ReplayBufferIndex,
    ReplayEntry,
    ReplayIndexError,
    ReplayIndexState,
)


def entry(
    group_id: str, *, step: int | None = 0, start: int = 0, end: int | None = None
) -> ReplayEntry:
    return ReplayEntry(
        group_id=group_id,
        sample_id="17",
        epoch=0,
        start_weight_version=start,
        end_weight_version=start if end is None else end,
        target_step=step,
    )


def ids(entries: list[ReplayEntry]) -> list[str]:
    return [e.group_id for e in entries]


def test_take_step_returns_exactly_that_step_in_insertion_order() -> None:
    index = ReplayBufferIndex()
    for group_id, step in [("a", 1), ("b", 0), ("c", 1), ("d", 2), ("e", 1)]:
        index.add(entry(group_id, step=step))
    assert index.count_for_step(1) == 3
    assert ids(index.take_step(1)) == ["a", "c", "e"]
    assert ids(list(index)) == ["b", "d"]
    assert index.count_for_step(1) == 0
    assert index.take_step(1) == []
    assert index.target_steps() == [0, 2]


def test_unstamped_groups_are_never_taken_by_step() -> None:
    index = ReplayBufferIndex()
    index.add(entry("w", step=None))
    assert index.target_steps() == []
    assert index.take_step(0) == []
    assert len(index) == 1


def test_duplicate_group_is_rejected() -> None:
    index = ReplayBufferIndex()
    index.add(entry("a", step=3))
    with pytest.raises(ReplayIndexError, match="group 'a' is already indexed \\(target step 3\\)"):
        index.add(entry("a", step=4))
    assert index.count_for_step(4) == 0


def test_end_before_start_is_rejected() -> None:
    with pytest.raises(ReplayIndexError, match="end_weight_version 1 < start_weight_version 2"):
        ReplayBufferIndex().add(entry("a", start=2, end=1))


def test_remove() -> None:
    index = ReplayBufferIndex()
    index.add(entry("a", step=0))
    index.add(entry("b", step=0))
    assert index.remove("a").group_id == "a"
    assert "a" not in index and "b" in index
    assert ids(index.take_step(0)) == ["b"]
    with pytest.raises(ReplayIndexError, match="group 'a' is not indexed"):
        index.remove("a")


def test_take_window_takes_oldest_fresh_groups_first() -> None:
    index = ReplayBufferIndex()
    for group_id, start in [("new", 5), ("old", 3), ("stale", 1), ("mid", 4), ("old2", 3)]:
        index.add(entry(group_id, step=None, start=start))
    taken = index.take_window(trainer_version=5, max_staleness_versions=2, limit=3)
    assert ids(taken) == ["old", "old2", "mid"]
    assert ids(list(index)) == ["new", "stale"]


def test_take_window_respects_limit_and_leaves_stale_groups() -> None:
    index = ReplayBufferIndex()
    index.add(entry("stale", step=None, start=0))
    index.add(entry("fresh", step=None, start=3))
    assert index.take_window(trainer_version=3, max_staleness_versions=1, limit=0) == []
    assert ids(index.take_window(trainer_version=3, max_staleness_versions=1, limit=5)) == ["fresh"]
    assert ids(index.take_stale(trainer_version=3, max_staleness_versions=1)) == ["stale"]
    assert len(index) == 0


def test_window_with_weights_from_the_future_is_an_error() -> None:
    index = ReplayBufferIndex()
    index.add(entry("x", step=None, start=4))
    with pytest.raises(ReplayIndexError, match="ahead of trainer_version 3"):
        index.take_window(trainer_version=3, max_staleness_versions=1, limit=1)
    assert len(index) == 1


def test_state_round_trips_through_json_in_order() -> None:
    index = ReplayBufferIndex()
    for group_id, step in [("g2", 1), ("g0", 0), ("g1", 0)]:
        index.add(entry(group_id, step=step, start=1, end=2))
    index.add(entry("w", step=None))
    encoded = msgspec.json.encode(index.state_dict())

    restored = ReplayBufferIndex()
    restored.load_state_dict(msgspec.json.decode(encoded, type=ReplayIndexState))
    assert list(restored) == list(index)
    assert ids(restored.take_step(0)) == ["g0", "g1"]
    assert restored.target_steps() == [1]


def test_state_dict_does_not_alias_live_state() -> None:
    index = ReplayBufferIndex()
    index.add(entry("a"))
    state = index.state_dict()
    index.add(entry("b"))
    index.remove("a")
    assert ids(list(state.entries)) == ["a"]


def test_load_rejects_duplicates_naming_both_positions() -> None:
    state = ReplayIndexState(
        schema_version=REPLAY_INDEX_SCHEMA_VERSION,
        entries=(entry("a"), entry("b"), entry("a", step=2)),
    )
    index = ReplayBufferIndex()
    with pytest.raises(
        ReplayIndexError, match=r"entries\[2\]: duplicate group_id 'a' \(first at entries\[0\]\)"
    ):
        index.load_state_dict(state)
    assert len(index) == 0


def test_load_rejects_unsupported_schema_version() -> None:
    state = ReplayIndexState(schema_version=REPLAY_INDEX_SCHEMA_VERSION + 1, entries=())
    with pytest.raises(ReplayIndexError, match="schema_version 2 is not supported"):
        ReplayBufferIndex().load_state_dict(state)


def test_load_rejects_constraint_violations_built_in_python() -> None:
    bad = ReplayIndexState(
        schema_version=REPLAY_INDEX_SCHEMA_VERSION,
        entries=(entry("a"), ReplayEntry("b", "1", -1, 0, 0, 0)),
    )
    with pytest.raises(ReplayIndexError, match=r"\$\.entries\[1\]\.epoch"):
        ReplayBufferIndex().load_state_dict(bad)


def test_load_rejects_end_before_start_naming_entry() -> None:
    bad = ReplayIndexState(
        schema_version=REPLAY_INDEX_SCHEMA_VERSION, entries=(entry("a", start=3, end=2),)
    )
    with pytest.raises(ReplayIndexError, match=r"entries\[0\]: group 'a'"):
        ReplayBufferIndex().load_state_dict(bad)


def test_load_into_a_non_empty_index_is_refused() -> None:
    index = ReplayBufferIndex()
    index.add(entry("a"))
    with pytest.raises(ReplayIndexError, match="already holds 1 groups"):
        index.load_state_dict(ReplayIndexState(schema_version=1, entries=(entry("b"),)))
    assert ids(list(index)) == ["a"]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (
            b'{"schema_version":1,"entries":[{"group_id":"a","sample_id":"1","epoch":0,'
            b'"start_weight_version":0,"end_weight_version":0,"target_step":"0"}]}',
            r"\$\.entries\[0\]\.target_step",
        ),
        (
            b'{"schema_version":1,"entries":[{"group_id":"","sample_id":"1","epoch":0,'
            b'"start_weight_version":0,"end_weight_version":0,"target_step":0}]}',
            r"\$\.entries\[0\]\.group_id",
        ),
        (
            b'{"schema_version":1,"entries":[{"group_id":"a","sample_id":"1","epoch":0,'
            b'"start_weight_version":0,"end_weight_version":0,"target_step":0,"x":1}]}',
            r"unknown field `x`",
        ),
        (b'{"schema_version":1}', r"missing required field `entries`"),
    ],
)
def test_decoding_a_bad_state_names_the_field(raw: bytes, path: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=path):
        msgspec.json.decode(raw, type=ReplayIndexState)


class ReplayIndexMachine(RuleBasedStateMachine):
    """The index against a plain list model, with state round trips along the way."""

    def __init__(self) -> None:
        super().__init__()
        self.index = ReplayBufferIndex()
        self.model: list[ReplayEntry] = []
        self.counter = 0

    @rule(step=st.integers(0, 3))
    def add(self, step: int) -> None:
        new = entry(f"g{self.counter}", step=step)
        self.counter += 1
        self.index.add(new)
        self.model.append(new)

    @rule(step=st.integers(0, 3))
    def take_step(self, step: int) -> None:
        expected = [e for e in self.model if e.target_step == step]
        assert self.index.take_step(step) == expected
        self.model = [e for e in self.model if e.target_step != step]

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from(self.model))
        assert self.index.remove(victim.group_id) == victim
        self.model.remove(victim)

    @rule()
    def round_trip(self) -> None:
        encoded = msgspec.json.encode(self.index.state_dict())
        self.index = ReplayBufferIndex()
        self.index.load_state_dict(msgspec.json.decode(encoded, type=ReplayIndexState))

    @invariant()
    def matches_model(self) -> None:
        assert list(self.index) == self.model
        for step in range(4):
            assert self.index.count_for_step(step) == sum(e.target_step == step for e in self.model)


ReplayIndexMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None
)
TestReplayIndexMachine = ReplayIndexMachine.TestCase
