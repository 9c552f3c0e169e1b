"""Runs of consecutive numbers: how indexes list the many segments whose entries are all live."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollvault.durable.index_runs import (
    consecutive_runs,
    expand_number_runs,
    in_a_run,
    in_file_order,
    keyed_runs,
    number_runs,
)


def test_consecutive_numbers_become_one_run_each() -> None:
    assert number_runs([2, 3, 4, 7, 9, 10]) == [(2, 3), (7, 1), (9, 2)]
    assert number_runs([]) == []
    with pytest.raises(ValueError, match="3 is not after 4"):
        number_runs([2, 3, 4, 3])


@given(st.sets(st.integers(0, 500)))
def test_runs_give_back_the_numbers(numbers: set[int]) -> None:
    runs = number_runs(sorted(numbers))
    assert expand_number_runs(runs) == sorted(numbers)
    # Maximal: two runs never touch, so a set has one spelling.
    assert all(a + n < b for (a, n), (b, _m) in zip(runs, runs[1:], strict=False))


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ([(1, 0)], r"\[0\]: an empty run \(0 numbers\)"),
        ([(1, 2), (3, 1)], r"\[1\]: the run from 3 touches the one before it"),
        ([(5, 1), (2, 1)], r"\[1\]: the run from 2 is not after the one before it"),
        ([(1, 3), (2, 4)], r"\[1\]: the run from 2 is not after the one before it"),
    ],
)
def test_runs_out_of_their_form_are_refused_naming_the_run(
    runs: list[tuple[int, int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        expand_number_runs(runs)


def test_keyed_runs_keep_the_order_and_break_at_a_new_key_or_a_gap() -> None:
    pairs = [(0, 3), (0, 4), (1, 5), (1, 6), (0, 5), (1, 8), (1, 7)]
    assert keyed_runs(pairs) == [(0, 3, 2), (1, 5, 2), (0, 5, 1), (1, 8, 1), (1, 7, 1)]
    assert consecutive_runs([4, 5, 6, 2, 3, 9]) == [(4, 3), (2, 2), (9, 1)]
    assert consecutive_runs([]) == []


@dataclass(frozen=True)
class _Entry:
    name: int | str
    live: list[int] | bytes


def test_only_a_numbered_entry_with_every_entry_live_belongs_in_a_run() -> None:
    assert in_a_run(_Entry(3, []))
    assert not in_a_run(_Entry("3-x", []))
    assert not in_a_run(_Entry(3, [1, 2]))
    assert not in_a_run(_Entry(3, b"\x01"))


def test_in_file_order_merges_runs_and_entries_by_file_name() -> None:
    whole = [("001", "w1"), ("003", "w3")]
    others = [("002", _Entry(2, [1, 1]), "e2"), ("004", _Entry("004", []), "e4")]
    assert in_file_order(whole, others) == ["w1", "e2", "w3", "e4"]


@pytest.mark.parametrize(
    ("others", "message"),
    [
        (
            [("002", _Entry(2, []), "e")],
            r"\[0\]: '002' holds only live entries: its place is a run",
        ),
        ([("001", _Entry(1, [1, 1]), "e")], r"\[0\]: '001' is in a run too"),
        (
            [("004", _Entry(4, [1, 1]), "e"), ("002", _Entry(2, [1, 1]), "f")],
            r"\[1\]: '002' is not after '004' \(by file name\)",
        ),
    ],
)
def test_in_file_order_refuses_another_spelling_naming_the_entry(
    others: list[tuple[str, _Entry, str]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        in_file_order([("001", "w1")], others)
