"""Incremental ledger snapshots under SIGKILL: at every fault point of a snapshot whose
changed records go to a new ledger segment (segment write, commit, retention, collection).

After each kill a fresh process must find every committed snapshot whole (each
referenced ledger segment present and intact, each group as its step left it), and the
next snapshot must commit and collect the orphans: afterwards the segments directory
holds exactly what the kept snapshots reference.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.faults import FAULT_POINTS, KILL_AT_ENV, TRACE_ENV

CHILD = Path(__file__).with_name("ledger_segments_crash_child.py")
pytestmark = pytest.mark.slow
_LEDGER_STEPS = (
    "ledger_segment.",
    "atomic_write.",
    "commit.before_rename",
    "commit.after_rename",
    "retention.before_trash_delete",
    "segment_gc.",
)


def _run(mode: str, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, TRACE_ENV)}
    environ.update(env)
    return subprocess.run(
        [sys.executable, str(CHILD), mode, str(directory)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ok(mode: str, directory: Path, **env: str) -> str:
    done = _run(mode, directory, **env)
    assert done.returncode == 0, f"{mode} failed:\n{done.stderr}"
    return done.stdout


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """Three committed steps: snapshots 2 and 3 kept, sharing ledger segments."""
    directory = tmp_path / "template"
    for _ in range(3):
        _ok("commit", directory)
    report: dict[str, Any] = json.loads(_ok("verify", directory))
    assert report["steps"] == [2, 3] and report["problems"] == {}
    assert report["segments"] == report["referenced"]
    assert len(report["referenced"]) > 1  # the third snapshot references an older segment
    return directory


def _kill_points(template: Path, tmp_path: Path) -> list[tuple[str, int]]:
    work = tmp_path / "traced"
    shutil.copytree(template, work)
    trace = tmp_path / "trace.txt"
    _ok("commit", work, **{TRACE_ENV: str(trace)})
    seen: Counter[str] = Counter()
    points = []
    for name in trace.read_text().splitlines():
        seen[name] += 1
        points.append((name, seen[name]))
    assert {name for name, _ in points} <= FAULT_POINTS
    # The steps that order ledger segments against the snapshot (the rest of the commit
    # and prune sequence is the durable layer's, killed at every point by its own tests).
    return [(name, nth) for name, nth in points if name.startswith(_LEDGER_STEPS)]


def test_a_kill_at_every_fault_point_of_an_incremental_ledger_snapshot_leaves_it_loadable(
    template: Path, tmp_path: Path
) -> None:
    points = _kill_points(template, tmp_path)
    names = {name for name, _ in points}
    assert {"ledger_segment.before_write", "ledger_segment.durable"} <= names
    assert {"segment_gc.before_delete", "segment_gc.synced"} <= names
    for index, (name, nth) in enumerate(points):
        work = tmp_path / f"kill_{index}"
        shutil.copytree(template, work)
        done = _run("commit", work, **{KILL_AT_ENV: f"{name}:{nth}"})
        assert done.returncode == -signal.SIGKILL, f"not killed at {name}:{nth}\n{done.stderr}"
        reports = json.loads(_ok("recover", work))
        after_kill, again = reports["before"], reports["after"]
        where = f"after a kill at {name}:{nth}"
        assert after_kill["problems"] == {}, where
        assert after_kill["steps"][-1] in (3, 4), where
        assert set(after_kill["referenced"]) <= set(after_kill["segments"]), where
        assert again["problems"] == {}, where
        assert again["steps"][-1] == after_kill["steps"][-1] + 1, where
        # Orphans (and a crashed write's temporaries) are collected by the next snapshot.
        assert again["all_files"] == again["referenced"], where
