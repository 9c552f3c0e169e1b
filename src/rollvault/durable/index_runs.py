"""Runs of consecutive numbers, and the one spelling every version 5 index gives its segments.

An index that would list many consecutive numbers one by one lists them as runs
instead: the ledger index's records per segment (:func:`keyed_runs`), the order of
the replay entries among their facts (:func:`consecutive_runs`), and the numbered
segments an index holds whole (:func:`number_runs`, read back by
:func:`expand_number_runs`).

The two per-snapshot indexes of version 5 (the data plane's ``metadata.json`` and
the controller's ``group_facts.json``) list their held segments alike: the numbered
ones all of whose entries are live (:func:`in_a_run`) as maximal runs of numbers,
every other one as an entry, in the order of the files' names. Each reader gives
back the list version 4 wrote, in its order, with :func:`in_file_order`, and refuses
any other spelling of the same set, so that a set of segments has one. Pure
functions: the callers name their files and fields in their own errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


def keyed_runs(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(key, number)`` pairs, in their order, as runs ``(key, first, count)``: each run the
    consecutive numbers, one after another in ``pairs``, of one key."""
    runs: list[tuple[int, int, int]] = []
    for key, number in pairs:
        if runs and runs[-1][0] == key and runs[-1][1] + runs[-1][2] == number:
            runs[-1] = (key, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((key, number, 1))
    return runs


def consecutive_runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """``numbers``, in their order, as runs ``(first, count)`` of consecutive ones."""
    return [(first, count) for _key, first, count in keyed_runs((0, n) for n in numbers)]


def number_runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """``numbers`` (ascending, distinct) as maximal runs ``(first, count)`` of consecutive
    ones: how an index lists the many segments whose entries are all live (a long anchor's
    indexes held ~10 bytes a segment for each of them, every snapshot). A number not after
    the one before it raises ``ValueError``."""
    return consecutive_runs(_ascending(numbers))


def _ascending(numbers: Iterable[int]) -> Iterator[int]:
    previous: int | None = None
    for number in numbers:
        if previous is not None and number <= previous:
            raise ValueError(f"{number} is not after {previous}")
        previous = number
        yield number


class RunsFormError(ValueError):
    """Runs of numbers not in :func:`number_runs`'s one spelling; ``position`` is the run's
    index in the runs given (the message names it as ``[position]`` too)."""

    def __init__(self, position: int, problem: str) -> None:
        super().__init__(f"[{position}]: {problem}")
        self.position = position


def expand_number_runs(runs: Sequence[tuple[int, int]]) -> list[int]:
    """The numbers :func:`number_runs` gave ``runs`` for. Only its form is taken: a
    ``ValueError`` names the run (``[position]``) that is empty, not after the previous one,
    or that touches it (runs are maximal, so a set of numbers has one spelling), as a
    :class:`RunsFormError`."""
    numbers: list[int] = []
    end = -2  # one past the previous run's last number; -2: no number is adjacent to it
    for position, (first, count) in enumerate(runs):
        if count < 1:
            raise RunsFormError(position, f"an empty run ({count} numbers)")
        if first <= end:
            problem = "touches" if first == end else "is not after"
            raise RunsFormError(position, f"the run from {first} {problem} the one before it")
        numbers.extend(range(first, first + count))
        end = first + count
    return numbers


class HeldEntry(Protocol):
    """A version 5 index's entry for a held segment (whatever else it records): the segment's
    sequence number or file name, and which of its entries are live (``[]``: all)."""

    @property
    def name(self) -> int | str: ...

    @property
    def live(self) -> list[int] | bytes: ...


def in_a_run(entry: HeldEntry) -> bool:
    """Whether a version 5 index lists ``entry``'s segment in a run of numbers rather than as
    an entry: numbered, every entry live."""
    return isinstance(entry.name, int) and entry.live == []


def in_file_order(
    whole: Iterable[tuple[str, T]], others: Sequence[tuple[str, HeldEntry, T]]
) -> list[T]:
    """A version 5 index's held segments as version 4 lists them: in the order of their files'
    names (the order its writer lists them in, which readers rely on). ``whole`` are the
    ``(file, listed)`` its runs of numbers stand for, ``others`` its entries as ``(file,
    entry, listed)``, in its order; the result is each ``listed``.

    One spelling per index, so a ``ValueError`` names the place (``[position]``) in
    ``others`` of an entry that belongs in a run (:func:`in_a_run`), is not after the one
    before it, or is in a run too."""
    listed = [(file, item) for file, item in whole]
    in_runs = {file for file, _item in listed}
    previous = ""
    for position, (file, entry, item) in enumerate(others):
        if in_a_run(entry):
            raise ValueError(f"[{position}]: {file!r} holds only live entries: its place is a run")
        if file in in_runs:
            raise ValueError(f"[{position}]: {file!r} is in a run too")
        if file <= previous:
            raise ValueError(f"[{position}]: {file!r} is not after {previous!r} (by file name)")
        previous = file
        listed.append((file, item))
    listed.sort(key=lambda pair: pair[0])
    return [item for _file, item in listed]
