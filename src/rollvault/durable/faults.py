"""Explicit fault injection for the crash tests of snapshot commit and prune.

Every step of a commit or prune that could be interrupted by a crash calls
``fault_point(name)``. In production no fault variable is set, the plan is
``None`` and a fault point is one function call and one global test.

Two environment variables, read once when this module is imported, turn it on
in a child process started by a test:

``ROLLVAULT_FAULT_TRACE=<file>``
    Append the name of every fault point reached to ``<file>``, one per line,
    with an unbuffered ``write`` so the lines survive a SIGKILL. A clean traced
    run lists every step of the sequence; the crash test then starts one child
    per ``(name, nth)`` pair and kills it there.

``ROLLVAULT_FAULT_KILL_AT=<name>:<nth>``
    SIGKILL this process when fault point ``<name>`` is reached for the
    ``<nth>`` time (1-based), right after it is traced.

``FAULT_POINTS`` lists every name; reaching an unlisted name while a plan is
active is a bug in the caller and raises.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Mapping
from typing import Final

KILL_AT_ENV: Final = "ROLLVAULT_FAULT_KILL_AT"
TRACE_ENV: Final = "ROLLVAULT_FAULT_TRACE"

FAULT_POINTS: Final = frozenset(
    {
        # fsync.py
        "fsync_tree.file_synced",
        "fsync_tree.directory_synced",
        "atomic_write.file_written",
        "atomic_write.file_synced",
        "atomic_write.renamed",
        "atomic_write.parent_synced",
        # snapshot_dirs.py: prepare
        "prepare.tmp_created",
        "prepare.parent_synced",
        "prepare.before_leftover_delete",
        "prepare.after_leftover_delete",
        # snapshot_dirs.py: commit
        "commit.manifest_validated",
        "commit.tree_synced",
        "commit.before_rename",
        "commit.after_rename",
        "commit.parent_synced",
        # snapshot_dirs.py: retention
        "retention.before_trash_rename",
        "retention.after_trash_rename",
        "retention.trash_synced",
        "retention.before_trash_delete",
        "retention.after_trash_delete",
        # trash deletion (shared by every prune and by prepare)
        "trash.file_deleted",
        # bootstrap.py: prune
        "bootstrap_prune.before_rename",
        "bootstrap_prune.after_rename",
        "bootstrap_prune.anchor_synced",
        "bootstrap_prune.before_delete",
        "bootstrap_prune.after_delete",
        # trainer_checkpoints.py
        "trainer_checkpoint.tree_synced",
        "trainer_checkpoint.after_rename",
        "trainer_checkpoint.parent_synced",
        "trainer_prune.before_trash_rename",
        "trainer_prune.after_trash_rename",
        "trainer_prune.trash_synced",
        "trainer_prune.before_trash_delete",
        "trainer_prune.after_trash_delete",
        # published_dirs.py
        "published_dir.tree_synced",
        "published_dir.old_trashed",
        "published_dir.after_rename",
        "published_dir.parent_synced",
        # segment_store.py: writing a segment (around atomic_write.*), deleting old ones
        "segment.before_write",
        "segment.durable",
        "ledger_segment.before_write",
        "ledger_segment.durable",
        "fact_segment.before_write",
        "fact_segment.durable",
        "catalog.before_write",
        "catalog.durable",
        "segment_gc.before_delete",
        "segment_gc.after_delete",
        "segment_gc.synced",
        # journal_writer.py: the seal journal
        "journal.segment_created",
        "journal.segment_dir_synced",
        "journal.records_written",
        "journal.records_synced",
        "journal.segment_dropped",
        "journal.repair_truncated",
    }
)


class _FaultPlan:
    """What the fault points of this process do: trace, kill, or both."""

    def __init__(self, *, kill_at: tuple[str, int] | None, trace_path: str | None) -> None:
        self.kill_at = kill_at
        self.trace_path = trace_path
        self._trace_fd: int | None = None
        self._hits: Counter[str] = Counter()
        self.part_of: int | None = None
        """The process this one is a part of (see :func:`kill_with`)."""

    def hit(self, name: str) -> None:
        if name not in FAULT_POINTS:
            raise ValueError(f"fault_point({name!r}): not a name listed in FAULT_POINTS")
        self._hits[name] += 1
        if self.trace_path is not None:
            if self._trace_fd is None:
                self._trace_fd = os.open(
                    self.trace_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
                )
            os.write(self._trace_fd, f"{name}\n".encode())
        if self.kill_at == (name, self._hits[name]):
            if self.part_of is not None:
                os.kill(self.part_of, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def _parse_kill_at(raw: str) -> tuple[str, int]:
    name, sep, nth_text = raw.rpartition(":")
    if not sep or not name or not nth_text.isdigit() or int(nth_text) < 1:
        raise ValueError(
            f"{KILL_AT_ENV}={raw!r}: expected '<fault point name>:<nth hit, 1 or more>'"
        )
    if name not in FAULT_POINTS:
        raise ValueError(f"{KILL_AT_ENV}={raw!r}: {name!r} is not a name listed in FAULT_POINTS")
    return name, int(nth_text)


def plan_from_environment(environ: Mapping[str, str]) -> _FaultPlan | None:
    """Build the fault plan the variables in ``environ`` ask for, or ``None``."""
    kill_raw = environ.get(KILL_AT_ENV) or None
    trace_path = environ.get(TRACE_ENV) or None
    if kill_raw is None and trace_path is None:
        return None
    kill_at = None if kill_raw is None else _parse_kill_at(kill_raw)
    return _FaultPlan(kill_at=kill_at, trace_path=trace_path)


_PLAN: _FaultPlan | None = plan_from_environment(os.environ)


def kill_with(pid: int) -> None:
    """Make a kill at this process's fault points kill process ``pid`` first.

    For a helper process that is part of another (the seal journal's writer
    process is part of the run that started it): a crash test that kills at
    one of its fault points means the run dies there, not the helper alone.
    Does nothing when no fault plan is active.
    """
    if _PLAN is not None:
        _PLAN.part_of = pid


def fault_point(name: str) -> None:
    """Mark one interruptible step; traces or kills only when a test asked for it."""
    if _PLAN is not None:
        _PLAN.hit(name)
