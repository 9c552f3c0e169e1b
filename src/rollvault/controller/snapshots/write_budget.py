"""The write budget that spreads a snapshot writer's optional rewrites over snapshots.

Two writers rewrite records they could leave as they are: the ledger segments'
whole rewrites (:mod:`.ledger_segments`) and the fact segments' merges
(:mod:`.fact_writer`). Made all at once when they come due, they gave some
snapshots of a long anchor 1.2-2.8x the bytes of their new rows. So a snapshot
spends on them at most a share of the bytes it writes anyway, plus what the
previous snapshot left unspent while a rewrite waited (:func:`carry_after`);
each writer keeps its own hard bounds that force a rewrite whatever the budget.
The carry is the writer's memory only: a snapshot that is never committed
carries nothing forward.

A rewrite by choice is also capped by the snapshot's **headroom** (:func:`headroom`):
issue 16's goal is a snapshot of at most 1.1x the bytes of its new rows, and what a
snapshot writes anyway beside them (the ledger's deltas, the new facts, the indexes)
does not shrink with them, so a rewrite that fits the budget can still push a round
with few new rows over. A due rewrite waits for a round whose rows leave it room; the
hard bounds still force it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypeVar

T = TypeVar("T")

HEADROOM_SHARE: Final = 0.1
"""Issue 16's goal: a snapshot writes at most ``1 + HEADROOM_SHARE`` times its new rows' bytes."""
ESTIMATE_SLACK: Final = 1024
"""Bytes kept back for the error of the estimate of the files written after the choice (the
previous snapshot's, see :func:`headroom`): the indexes grow by ~0.1 KB a snapshot."""


def headroom(new_row_bytes: int, written: int, estimated: int | None) -> int:
    """Bytes a snapshot may still rewrite by choice and stay within ``1 + HEADROOM_SHARE`` times
    its ``new_row_bytes``: what is left after the bytes it writes anyway, ``written`` (known
    when the choice is made) and ``estimated`` (written after it), less
    :data:`ESTIMATE_SLACK`. Never negative; 0 without an estimate (``None``: a writer's first
    snapshot), so nothing is rewritten by choice before the snapshot's size is known."""
    if estimated is None:
        return 0
    return max(0, int(HEADROOM_SHARE * new_row_bytes) - written - estimated - ESTIMATE_SLACK)


def write_budget(share: float, change_bytes: int, carry: int, room: int | None = None) -> int:
    """Bytes a snapshot may rewrite by choice: ``share`` times the bytes it writes anyway
    (``change_bytes``), plus ``carry`` (:func:`carry_after` of the previous snapshot), at most
    ``room`` (:func:`headroom`, less what the writer itself writes anyway) when given."""
    budget = int(share * change_bytes) + carry
    return budget if room is None else min(budget, max(0, room))


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
