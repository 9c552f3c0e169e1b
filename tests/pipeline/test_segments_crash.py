"""Incremental snapshots under SIGKILL: at every fault point of a snapshot whose new rows
go to a new row segment, whose changed ledger records go to a new ledger segment, or
whose new group facts go to a new fact segment (segment write, index, commit, retention,
segment collection).

Each case has its own child process (``segments_crash_child.py`` for rows,
``ledger_segments_crash_child.py`` for the ledger, ``fact_segments_crash_child.py``
for the group facts), forked per run from a
process that imported it once (``child_zygote.py``: a fresh Python's imports
cost more than the child's work). After each kill a fresh process
must find every committed snapshot whole (each referenced segment present and
intact, each row or group as its step left it), and the next snapshot must commit
and collect the orphans: afterwards the segments directory holds exactly what the
kept snapshots reference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from child_zygote import Zygote

from rollvault.durable.faults import FAULT_POINTS, KILL_AT_ENV, TRACE_ENV

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class CrashCase:
    child: Path
    steps: tuple[str, ...]
    """Fault points that order this case's segments against the snapshot (the rest of
    the commit and prune sequence is the durable layer's, killed by its own tests)."""
    required: frozenset[str]
    """Points the traced commit must pass through."""
    env: tuple[tuple[str, str], ...] = ()
    """Set for every run of the child."""
    name: str = ""
    """The test id (default: the child's name)."""

    def __str__(self) -> str:
        return self.name or self.child.stem


ROWS = CrashCase(
    child=Path(__file__).with_name("segments_crash_child.py"),
    steps=(
        "segment.",
        "catalog.",
        "atomic_write.",
        "commit.before_rename",
        "commit.after_rename",
        "retention.before_trash_delete",
        "retention.after_trash_delete",
        "segment_gc.",
    ),
    required=frozenset(
        {
            "segment.before_write",
            "segment.durable",
            "catalog.before_write",
            "catalog.durable",
            "commit.before_rename",
            "segment_gc.before_delete",
            "segment_gc.after_delete",
            "segment_gc.synced",
        }
    ),
)
ROW_CATALOG_MERGES = dataclasses.replace(
    ROWS,
    # One catalog listed at most: every step moves the older catalog's live entries into
    # its own (see segments_crash_child.py).
    env=(("ROLLVAULT_TEST_MAX_CATALOGS", "1"),),
    name="row_catalogs_merging",
)
LEDGER = CrashCase(
    child=Path(__file__).with_name("ledger_segments_crash_child.py"),
    steps=(
        "ledger_segment.",
        "catalog.",
        "atomic_write.",
        "commit.before_rename",
        "commit.after_rename",
        "retention.before_trash_delete",
        "segment_gc.",
    ),
    required=frozenset(
        {
            "ledger_segment.before_write",
            "ledger_segment.durable",
            "catalog.before_write",
            "catalog.durable",
            "segment_gc.before_delete",
            "segment_gc.synced",
        }
    ),
)

FACTS = CrashCase(
    child=Path(__file__).with_name("fact_segments_crash_child.py"),
    steps=(
        "fact_segment.",
        "catalog.",
        "atomic_write.",
        "commit.before_rename",
        "commit.after_rename",
        "retention.before_trash_delete",
        "segment_gc.",
    ),
    required=frozenset(
        {
            "fact_segment.before_write",
            "fact_segment.durable",
            "catalog.before_write",
            "catalog.durable",
            "segment_gc.before_delete",
            "segment_gc.synced",
        }
    ),
)

FACT_MERGES = dataclasses.replace(
    FACTS,
    # No segment counts as sparse, and past one referenced segment the older one is due a
    # merge: every step merges by the budget (see fact_segments_crash_child.py).
    env=(("ROLLVAULT_TEST_FACT_MERGE_BOUNDS", "1,2"),),
    name="fact_segments_merging",
)


@dataclass(frozen=True)
class Child:
    """A case and the zygote its child processes are forked from."""

    case: CrashCase
    zygote: Zygote

    def run(self, mode: str, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, TRACE_ENV)}
        environ.update(self.case.env)
        environ.update(env)
        return self.zygote.run([mode, str(directory)], environ)

    def ok(self, mode: str, directory: Path, **env: str) -> str:
        done = self.run(mode, directory, **env)
        assert done.returncode == 0, f"{self.case} {mode} failed:\n{done.stderr}"
        return done.stdout


def _template(child: Child, directory: Path) -> Path:
    """Three committed steps: snapshots 2 and 3 kept, sharing segments."""
    case = child.case
    for _ in range(3):
        child.ok("commit", directory)
    report: dict[str, Any] = json.loads(child.ok("verify", directory))
    assert report["steps"] == [2, 3] and report["problems"] == {}
    assert report["segments"] == report["referenced"]
    if case in (LEDGER, FACTS, FACT_MERGES):
        assert len(report["referenced"]) > 1  # the third snapshot references an older segment
    if case is LEDGER:
        # Each step is a restart, whose seeded writer does not know the catalogs: its
        # snapshot writes one describing every segment it references (the older ones too).
        assert report["catalogs_listed"] == {"snapshot_000002": 1, "snapshot_000003": 1}
    if case is ROW_CATALOG_MERGES:
        # One catalog a snapshot: the third's describes its segment and the older one it
        # still holds rows of, moved from the second's catalog.
        assert report["catalog_entries"]["snapshot_000003"] == [2]
    elif case is ROWS:
        assert report["catalog_entries"]["snapshot_000003"] == [1, 1]
    return directory


def _kill_points(child: Child, template: Path, tmp_path: Path) -> list[tuple[str, int]]:
    work = tmp_path / "traced"
    shutil.copytree(template, work)
    trace = tmp_path / "trace.txt"
    done = child.ok("commit", work, **{TRACE_ENV: str(trace)})
    if child.case is FACT_MERGES:  # the commit killed below merges by the budget
        info = json.loads(done)
        assert info["compacted"] > 0 and info["merged_bytes"] > 0 and info["forced"] == 0
    seen: Counter[str] = Counter()
    points = []
    for name in trace.read_text().splitlines():
        seen[name] += 1
        points.append((name, seen[name]))
    assert {name for name, _ in points} <= FAULT_POINTS
    return [(name, nth) for name, nth in points if name.startswith(child.case.steps)]


@pytest.mark.parametrize("case", [ROWS, ROW_CATALOG_MERGES, LEDGER, FACTS, FACT_MERGES], ids=str)
def test_a_kill_at_every_fault_point_of_an_incremental_snapshot_leaves_it_loadable(
    case: CrashCase, tmp_path: Path
) -> None:
    with Zygote(case.child) as zygote:
        _kill_at_every_point(Child(case, zygote), tmp_path)


def _kill_at_every_point(child: Child, tmp_path: Path) -> None:
    case = child.case
    template = _template(child, tmp_path / "template")
    points = _kill_points(child, template, tmp_path)
    assert case.required <= {name for name, _ in points}
    for index, (name, nth) in enumerate(points):
        work = tmp_path / f"kill_{index}"
        shutil.copytree(template, work)
        done = child.run("commit", work, **{KILL_AT_ENV: f"{name}:{nth}"})
        assert done.returncode == -signal.SIGKILL, f"not killed at {name}:{nth}\n{done.stderr}"
        reports = json.loads(child.ok("recover", work))
        after_kill, again = reports["before"], reports["after"]
        where = f"{case}: after a kill at {name}:{nth}"
        assert after_kill["problems"] == {}, where
        assert after_kill["steps"][-1] in (3, 4), where
        assert set(after_kill["referenced"]) <= set(after_kill["segments"]), where
        assert again["problems"] == {}, where
        assert again["steps"][-1] == after_kill["steps"][-1] + 1, where
        # Orphans (and a crashed write's temporaries) are collected by the next snapshot.
        assert again["all_files"] == again["referenced"], where
