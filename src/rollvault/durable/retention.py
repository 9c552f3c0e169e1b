"""Retention: keep the newest K of a list of directories, prune the rest through trash.

One mechanism for rollout snapshots, trainer checkpoints and the bootstrap
anchor's snapshots. Pruning renames every victim to ``trash_<name>`` in the
same parent, flushes the parent, and only then deletes the trash: a crash
never leaves a half-deleted directory under a committed name, and nothing
ever reads a ``trash_`` directory (the next prune or publication clears it).

Each caller names its own :class:`PruneFaultPoints`, so that the crash tests
can kill each sequence at every step (see :mod:`rollvault.durable.faults`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rollvault.durable.fsync import _fsync_directory
from rollvault.durable.trash import remove_tree

_T = TypeVar("_T")


@dataclass(frozen=True)
class PruneFaultPoints:
    """The fault points one pruning sequence reaches, in order.

    Each calls ``fault_point`` with its name spelled out at the caller
    (``lambda: fault_point("<sequence>.<step>")``), so that every name listed
    in ``FAULT_POINTS`` can be found where it is reached.
    """

    before_rename: Callable[[], None]
    after_rename: Callable[[], None]
    synced: Callable[[], None]
    """After the renames are flushed, before anything is deleted."""
    before_delete: Callable[[], None]
    after_delete: Callable[[], None]


def check_keep_latest_k(keep_latest_k: int) -> None:
    """Refuse a retention count that is not an integer >= 1 (a bug, not a condition)."""
    if isinstance(keep_latest_k, bool) or not isinstance(keep_latest_k, int) or keep_latest_k < 1:
        raise ValueError(f"keep_latest_k must be an integer >= 1, got {keep_latest_k!r}")


def beyond_latest(entries: Sequence[_T], *, keep_latest_k: int) -> list[_T]:
    """The entries (oldest first) that keeping the newest ``keep_latest_k`` leaves out."""
    check_keep_latest_k(keep_latest_k)
    return list(entries[: max(len(entries) - keep_latest_k, 0)])


def trash_name(path: Path) -> Path:
    """Where :func:`prune_through_trash` parks ``path`` between its rename and its delete."""
    return path.with_name(f"trash_{path.name}")


def prune_through_trash(
    parent: Path,
    victims: Sequence[Path],
    *,
    points: PruneFaultPoints,
    unfinished: Sequence[Path] = (),
) -> list[Path]:
    """Delete ``victims`` (entries of ``parent``) crash-safely; return the trash deleted.

    Each victim is renamed to its :func:`trash_name` (a stale trash of that
    name, left by a crashed earlier prune, is removed first), the renames are
    flushed, then every trash directory is deleted, together with the
    ``unfinished`` trash directories a crashed earlier prune left behind.
    """
    trashed = []
    for victim in victims:
        trash = trash_name(victim)
        remove_tree(trash)
        points.before_rename()
        os.rename(victim, trash)
        points.after_rename()
        trashed.append(trash)
    if trashed:
        _fsync_directory(parent)
        points.synced()
    doomed = trashed + [trash for trash in unfinished if trash not in trashed]
    for trash in doomed:
        points.before_delete()
        remove_tree(trash)
        points.after_delete()
    return doomed
