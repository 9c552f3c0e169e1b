"""Keep-latest-K retention through trash, shared by snapshots and trainer checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollvault.durable.retention import (
    PruneFaultPoints,
    beyond_latest,
    prune_through_trash,
    trash_name,
)
from rollvault.durable.snapshot_dirs import SNAPSHOT_RETENTION_POINTS

POINTS: PruneFaultPoints = SNAPSHOT_RETENTION_POINTS


def _entries(root: Path, *names: str) -> list[Path]:
    paths = []
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "payload").write_text(name)
        paths.append(root / name)
    return paths


@pytest.mark.parametrize(("keep", "pruned"), [(1, ["a", "b"]), (2, ["a"]), (3, []), (9, [])])
def test_beyond_latest_leaves_out_all_but_the_newest_k(keep: int, pruned: list[str]) -> None:
    assert beyond_latest(["a", "b", "c"], keep_latest_k=keep) == pruned


@pytest.mark.parametrize("keep", [0, -1, True, 1.5])
def test_beyond_latest_refuses_a_bad_count(keep: object) -> None:
    with pytest.raises(ValueError, match="keep_latest_k must be an integer >= 1"):
        beyond_latest(["a"], keep_latest_k=keep)  # type: ignore[arg-type]


def test_prune_renames_then_deletes_and_finishes_an_earlier_prune(tmp_path: Path) -> None:
    old, newer, kept = _entries(tmp_path, "step_1", "step_2", "step_3")
    stale = trash_name(newer)  # a crashed earlier prune's half-deleted copy of the same name
    stale.mkdir()
    (stale / "partial").write_text("x")
    unfinished = tmp_path / "trash_step_0"
    unfinished.mkdir()
    deleted = prune_through_trash(
        tmp_path,
        beyond_latest([old, newer, kept], keep_latest_k=1),
        points=POINTS,
        unfinished=[unfinished, stale],
    )
    assert deleted == [trash_name(old), stale, unfinished]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]
    assert (kept / "payload").read_text() == "step_3"


def test_nothing_to_prune_touches_nothing(tmp_path: Path) -> None:
    (only,) = _entries(tmp_path, "snapshot_000001")
    assert prune_through_trash(tmp_path, [], points=POINTS) == []
    assert [p.name for p in tmp_path.iterdir()] == [only.name]
