"""The write budget that spreads a snapshot writer's optional rewrites over snapshots.

Two writers rewrite records they could leave as they are: the ledger segments'
whole rewrites (:mod:`.ledger_segments`) and the fact segments' merges
(:mod:`.fact_segments`). Made all at once when they come due, they gave some
snapshots of a long anchor 1.2-2.8x the bytes of their new rows. So a snapshot
spends on them at most a share of the bytes it writes anyway, plus what the
previous snapshot left unspent while a rewrite waited (:func:`carry_after`);
each writer keeps its own hard bounds that force a rewrite whatever the budget.
The carry is the writer's memory only: a snapshot that is never committed
carries nothing forward.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def write_budget(share: float, change_bytes: int, carry: int) -> int:
    """Bytes a snapshot may rewrite by choice: ``share`` times the bytes it writes anyway
    (``change_bytes``), plus ``carry`` (:func:`carry_after` of the previous snapshot)."""
    return int(share * change_bytes) + carry


def take_within(budget: int, candidates: Iterable[tuple[int, T]]) -> tuple[list[T], int]:
    """The ``(cost, item)`` candidates taken in the order given while they fit ``budget``, and
    what they cost. The first that does not fit stops it: a smaller one behind it waits its
    turn, so the order (the writer's priority) is kept. ``candidates`` may be lazy: a cost
    past that first one is never computed."""
    taken: list[T] = []
    spent = 0
    for cost, item in candidates:
        if spent + cost > budget:
            break
        taken.append(item)
        spent += cost
    return taken, spent


def carry_after(budget: int, spent: int, *, waiting: bool) -> int:
    """What a snapshot leaves for the next one's budget: its unspent bytes while a due
    rewrite waits, else nothing. So the carry never grows past one rewrite plus one
    snapshot's share, and nothing is saved up for a burst while nothing is due."""
    return budget - spent if waiting else 0
