"""Real-process crash tests of the journal: SIGKILL at every fault point.

A child appends, rotates and drops segments and is killed at one
``(fault point, nth)``. A fresh process must then read a gapless run of
verified records that holds every record the child saw durable, never miss a
record no rotation covered, and append after them. The children are forked
from one process that imported the child script once (``child_zygote``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from zygote_slot import ZygoteSlot

from rollvault.durable.faults import KILL_AT_ENV, TRACE_ENV

CHILD = Path(__file__).with_name("journal_crash_child.py")
pytestmark = pytest.mark.slow


# Module-wide, so that the helpers below stay plain functions of their arguments.
CHILDREN = ZygoteSlot(CHILD)
_child_zygote = CHILDREN.module_fixture()


def _run(mode: str, journal: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, TRACE_ENV)}
    environ.update(env)
    return CHILDREN.run([mode, str(journal)], environ)


def _last(stdout: str, word: str) -> int | None:
    values = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith(word)]
    return max(values) if values else None


def _traced_points(tmp_path: Path) -> Counter[str]:
    trace = tmp_path / "trace.txt"
    done = _run("write", tmp_path / "traced", **{TRACE_ENV: str(trace)})
    assert done.returncode == 0, done.stderr
    return Counter(trace.read_text().split())


def test_a_kill_at_any_journal_step_keeps_every_durable_record(tmp_path: Path) -> None:
    hits = _traced_points(tmp_path)
    journal_points = {name: n for name, n in hits.items() if name.startswith("journal.")}
    # 16 records, 5 of them lazy: 11 groups of a non-lazy record (4 with the lazy one
    # before it riding on it) and lazy record 4 alone, flushed by the rotation after it.
    assert hits["journal.records_synced"] == 12
    assert {"journal.records_synced", "journal.segment_dropped"} <= set(journal_points)
    cases = [(name, nth) for name, n in sorted(journal_points.items()) for nth in {1, 2, n}]
    for name, nth in cases:
        journal = tmp_path / f"{name}_{nth}"
        # A first clean run, so that every kill lands in a journal with history.
        first_run = _run("write", journal)
        assert first_run.returncode == 0, first_run.stderr
        killed = _run("write", journal, **{KILL_AT_ENV: f"{name}:{nth}"})
        assert killed.returncode == -9, f"{name}:{nth} was not reached:\n{killed.stderr}"
        check = _run("check", journal)
        assert check.returncode == 0, f"{name}:{nth}: check failed:\n{check.stderr}"
        report = json.loads(check.stdout)
        seqs = report["seqs"]
        where = f"killed at {name}:{nth}"
        assert report["bad_payloads"] == [], where
        durable = _last(first_run.stdout + killed.stdout, "durable")
        covered = _last(first_run.stdout + killed.stdout, "covered")
        assert durable is not None and covered is not None, where
        if seqs:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{where}: a gap"
            assert seqs[-1] >= durable, f"{where}: lost durable record {durable}"
            assert seqs[0] <= covered + 1, f"{where}: dropped records after {covered}"
            assert report["appended"] == seqs[-1] + 1, where
        else:
            # Every record was covered and dropped; numbering still goes on after them.
            assert durable <= covered, f"{where}: lost durable record {durable}"
            assert report["appended"] == covered + 1, where
        assert report["after_seqs"][-1] == report["appended"], where
        assert report["after_damage"] is None, where
