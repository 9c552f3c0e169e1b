"""Real-process crash tests: SIGKILL at every fault point and at random moments.

A child process commits or prunes snapshots and is killed (by the fault hook
at a chosen ``(point, nth)``, or by us after a random delay). Then a fresh
process must find every committed snapshot complete, resolve the old or the
new one, and commit the next snapshot successfully. The children are forked
from one process that imported the child script once (``child_zygote``),
except the randomly killed one, which is a new Python each time.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from zygote_slot import ZygoteSlot

from rollvault.durable.faults import FAULT_POINTS, KILL_AT_ENV, TRACE_ENV

CHILD = Path(__file__).with_name("durable_crash_child.py")
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, TRACE_ENV)}
    env.update(extra)
    return env


# Module-wide, so that the helpers below stay plain functions of their arguments.
CHILDREN = ZygoteSlot(CHILD)
_child_zygote = CHILDREN.module_fixture()


def _run(
    mode: str, checkpoint_dir: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return CHILDREN.run([mode, str(checkpoint_dir), *args], _env(**env))


def _ok(mode: str, checkpoint_dir: Path, *args: str) -> str:
    done = _run(mode, checkpoint_dir, *args)
    assert done.returncode == 0, f"{mode} failed:\n{done.stderr}"
    return done.stdout


def _verify(checkpoint_dir: Path, *, commit: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        _ok("verify", checkpoint_dir, *(["--commit"] if commit else []))
    )
    return result


def _kill_points(trace: Path) -> list[tuple[str, int]]:
    """Every ``(name, nth)`` a traced clean run reached, in order."""
    seen: Counter[str] = Counter()
    points = []
    for name in trace.read_text().splitlines():
        seen[name] += 1
        points.append((name, seen[name]))
    return points


def _traced_clean_run(template: Path, tmp_path: Path, mode: str) -> list[tuple[str, int]]:
    work = tmp_path / f"traced_{mode}"
    shutil.copytree(template, work)
    trace = tmp_path / f"trace_{mode}.txt"
    done = _run(mode, work, **{TRACE_ENV: str(trace)})
    assert done.returncode == 0, done.stderr
    points = _kill_points(trace)
    assert {name for name, _ in points} <= FAULT_POINTS
    return points


def _kill_at(template: Path, work: Path, mode: str, name: str, nth: int) -> None:
    shutil.copytree(template, work)
    done = _run(mode, work, **{KILL_AT_ENV: f"{name}:{nth}"})
    assert done.returncode == -signal.SIGKILL, (
        f"child was not killed at {name}:{nth} (rc={done.returncode})\n{done.stderr}"
    )


def _assert_recovers(work: Path, *, old: int, new: int, where: str) -> None:
    result = _verify(work)
    before, after = result["before"], result["after"]
    assert before["problems"] == {}, f"incomplete committed snapshot after kill at {where}"
    assert before["resolved"] in (old, new), f"kill at {where} resolved {before['resolved']}"
    assert after["problems"] == {}
    assert after["resolved"] == result["committed_sequence"] > new
    assert not [e for e in after["entries"] if not e.startswith("snapshot_")], after["entries"]


@pytest.fixture
def commit_template(tmp_path: Path) -> Path:
    """Committed snapshots 2 and 3 plus a leftover trash_1 and tmp_4 of a crashed run."""
    template = tmp_path / "template"
    for _ in range(3):
        _ok("commit", template)
    root = template / "bootstrap" / "rollout_snapshots"
    # Snapshot 1 was pruned by the third commit; recreate the debris a crash leaves.
    (root / "trash_snapshot_000001").mkdir()
    (root / "trash_snapshot_000001" / "payload.json").write_text("partial")
    (root / "tmp_snapshot_000004").mkdir()
    (root / "tmp_snapshot_000004" / "manifest.json").write_text("{}")
    return template


def test_kill_at_every_commit_fault_point(commit_template: Path, tmp_path: Path) -> None:
    points = _traced_clean_run(commit_template, tmp_path, "commit")
    names = {name for name, _ in points}
    assert {"commit.before_rename", "commit.after_rename", "retention.before_trash_delete"} <= names
    assert {
        "prepare.before_leftover_delete",
        "fsync_tree.file_synced",
        "trash.file_deleted",
    } <= names
    for index, (name, nth) in enumerate(points):
        work = tmp_path / f"kill_{index}"
        _kill_at(commit_template, work, "commit", name, nth)
        _assert_recovers(work, old=3, new=5, where=f"{name}:{nth}")


def test_kill_at_every_prune_fault_point(commit_template: Path, tmp_path: Path) -> None:
    points = _traced_clean_run(commit_template, tmp_path, "prune")
    assert {name for name, _ in points} >= {"bootstrap_prune.before_rename", "trash.file_deleted"}
    for index, (name, nth) in enumerate(points):
        work = tmp_path / f"prune_{index}"
        _kill_at(commit_template, work, "prune", name, nth)
        before = _verify(work, commit=False)["before"]
        renamed = "rollout_snapshots" not in before["anchor_entries"]
        leftover = set(before["anchor_entries"]) - {"manifest.json"}
        assert before["problems"] == {}
        assert before["resolved"] == (None if renamed else 3), f"kill at {name}:{nth}"
        assert json.loads(_ok("prune", work)) == {"pruned": bool(leftover)}
        assert sorted(p.name for p in (work / "bootstrap").iterdir()) == ["manifest.json"]


def test_kill_at_every_anchor_write_fault_point(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    points = _traced_clean_run(empty, tmp_path, "anchor")
    assert [name for name, _ in points][:2] == [
        "atomic_write.file_written",
        "atomic_write.file_synced",
    ]
    for index, (name, nth) in enumerate(points):
        work = tmp_path / f"anchor_{index}"
        _kill_at(empty, work, "anchor", name, nth)
        result = _verify(work)
        assert result["after"]["resolved"] == result["committed_sequence"] == 1
        assert sorted(p.name for p in (work / "bootstrap").iterdir()) == [
            "manifest.json",
            "rollout_snapshots",
        ], "a stale temporary of the anchor manifest was left behind"


def test_kill_at_random_moments_while_committing(tmp_path: Path) -> None:
    seed = int(os.environ.get("ROLLVAULT_CRASH_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    work = tmp_path / "loop"
    _ok("commit", work)
    newest = 1
    for iteration in range(10):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), "loop", str(work)],
            env=_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            child.stdout.readline()  # one commit done: the next kill lands mid-sequence
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=rng.uniform(0.0, 0.25))
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        where = f"seed {seed}, iteration {iteration}"
        result = _verify(work)
        assert result["before"]["problems"] == {}, where
        assert result["before"]["resolved"] > newest, where
        assert result["after"]["resolved"] == result["committed_sequence"], where
        newest = result["committed_sequence"]
