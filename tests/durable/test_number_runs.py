"""Runs of consecutive numbers: how indexes list the many segments whose entries are all live."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollvault.durable.segment_store import expand_number_runs, number_runs


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
