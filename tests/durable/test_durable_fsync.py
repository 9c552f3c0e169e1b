"""Flushing files, directories and trees; atomic small writes; tree removal."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rollvault.durable.errors import SnapshotLayoutError
from rollvault.durable.fsync import _fsync_directory, _fsync_file, _fsync_tree, atomic_write_bytes
from rollvault.durable.trash import remove_tree


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record the path behind every fd passed to os.fsync, in order."""
    calls: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return calls


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.bin").write_bytes(b"1")
    (root / "a" / "mid.bin").write_bytes(b"2")
    (root / "a" / "b" / "leaf.bin").write_bytes(b"3")


def test_fsync_file_and_directory_flush_the_given_path(tmp_path: Path, fsynced: list[Path]) -> None:
    file_path = tmp_path / "f.bin"
    file_path.write_bytes(b"x")
    _fsync_file(file_path)
    _fsync_directory(tmp_path)
    assert fsynced == [file_path, tmp_path]


def test_fsync_directory_refuses_a_file(tmp_path: Path) -> None:
    file_path = tmp_path / "f.bin"
    file_path.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        _fsync_directory(file_path)


def test_fsync_tree_flushes_every_file_then_each_directory_after_its_children(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    root = tmp_path / "snap"
    _tree(root)
    _fsync_tree(root)
    files = {root / "top.bin", root / "a" / "mid.bin", root / "a" / "b" / "leaf.bin"}
    assert set(fsynced) == files | {root, root / "a", root / "a" / "b"}
    assert len(fsynced) == 6
    order = {path: index for index, path in enumerate(fsynced)}
    assert order[root / "a" / "b" / "leaf.bin"] < order[root / "a" / "b"] < order[root / "a"]
    assert order[root / "a" / "mid.bin"] < order[root / "a"] < order[root]
    assert fsynced[-1] == root


def test_fsync_tree_refuses_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    _tree(root)
    (root / "a" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(
        SnapshotLayoutError, match=r"a/link: a snapshot may hold only regular files"
    ):
        _fsync_tree(root)


def test_fsync_tree_propagates_fsync_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "snap"
    _tree(root)

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="I/O error"):
        _fsync_tree(root)


def test_atomic_write_creates_and_replaces_with_exact_bytes(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    target = tmp_path / "manifest.json"
    atomic_write_bytes(target, b"first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    assert fsynced[-1] == tmp_path, "the rename must be flushed through the directory"


def test_atomic_write_failure_keeps_old_bytes_and_removes_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    atomic_write_bytes(target, b"old")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_atomic_write_removes_temporaries_of_crashed_earlier_writes(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    (tmp_path / ".manifest.json.tmp.123.abcd").write_bytes(b"torn")
    (tmp_path / ".other.json.tmp.1.x").write_bytes(b"not ours")
    atomic_write_bytes(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.tmp.1.x", "manifest.json"]


def test_remove_tree_deletes_everything_without_following_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.bin").write_bytes(b"k")
    root = tmp_path / "trash_snapshot_000001"
    _tree(root)
    (root / "a" / "dirlink").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "keep.bin")
    remove_tree(root)
    assert not root.exists()
    assert (outside / "keep.bin").read_bytes() == b"k"


def test_remove_tree_of_missing_path_is_a_no_op(tmp_path: Path) -> None:
    remove_tree(tmp_path / "gone")
    assert list(tmp_path.iterdir()) == []
