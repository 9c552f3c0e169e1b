"""Snapshot directories: names, allocation, commit, retention and failure cleanup."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rollvault.durable import snapshot_dirs
from rollvault.durable.errors import SnapshotLayoutError, SnapshotManifestError, SnapshotWriteError
from rollvault.durable.manifest_schema import (
    RolloutSnapshotManifest,
    read_snapshot_manifest,
    write_snapshot_manifest,
)
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import (
    _SNAPSHOT_RE,
    _TMP_SNAPSHOT_RE,
    _TRASH_SNAPSHOT_RE,
    _apply_retention,
    _snapshot_sequence,
    abort_snapshot,
    commit_snapshot,
    prepare_snapshot_paths,
)

CommitOne = Callable[..., Path]
MakeManifest = Callable[..., RolloutSnapshotManifest]


def _names(anchor: Path) -> list[str]:
    return sorted(p.name for p in (anchor / "rollout_snapshots").iterdir())


def _full_disk(fd: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    ("name", "sequence"),
    [
        ("snapshot_000012", 12),
        ("snapshot_12", 12),
        ("tmp_snapshot_000007", 7),
        ("trash_snapshot_3", 3),
        ("snapshot_1234567", 1234567),
    ],
)
def test_snapshot_sequence_parses_padded_and_unpadded_names(name: str, sequence: int) -> None:
    assert _snapshot_sequence(Path("/x") / name) == sequence


@pytest.mark.parametrize(
    "name",
    ["snapshot_", "snapshot_1a", "snapshot_-1", "old_snapshot_1", "snapshot_١", "manifest.json"],
)
def test_snapshot_sequence_rejects_other_names(name: str) -> None:
    with pytest.raises(SnapshotLayoutError, match="not a snapshot directory name"):
        _snapshot_sequence(Path("/x") / name)


def test_name_patterns_do_not_overlap() -> None:
    for name in ("snapshot_1", "tmp_snapshot_1", "trash_snapshot_1"):
        matches = [
            p for p in (_SNAPSHOT_RE, _TMP_SNAPSHOT_RE, _TRASH_SNAPSHOT_RE) if p.fullmatch(name)
        ]
        assert len(matches) == 1, name


def test_prepare_creates_the_tmp_dir_and_names_the_final_one(anchor: Path) -> None:
    tmp_path, final_path, sequence = prepare_snapshot_paths(anchor)
    assert sequence == 1
    assert tmp_path == anchor / "rollout_snapshots" / "tmp_snapshot_000001"
    assert final_path == anchor / "rollout_snapshots" / "snapshot_000001"
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []
    assert not final_path.exists()


def test_prepare_requires_an_existing_anchor(tmp_path: Path) -> None:
    with pytest.raises(SnapshotLayoutError, match="anchor directory .*missing does not exist"):
        prepare_snapshot_paths(tmp_path / "missing")


def test_prepare_never_reuses_a_sequence_and_clears_leftovers(
    anchor: Path, commit_one: CommitOne
) -> None:
    commit_one(anchor)
    root = anchor / "rollout_snapshots"
    (root / "tmp_snapshot_9").mkdir()
    (root / "tmp_snapshot_9" / "half.bin").write_bytes(b"x")
    (root / "trash_snapshot_000004").mkdir()
    (root / "unrelated.txt").write_text("kept")
    tmp_path, _final, sequence = prepare_snapshot_paths(anchor)
    assert sequence == 10
    assert _names(anchor) == ["snapshot_000001", "tmp_snapshot_000010", "unrelated.txt"]
    assert tmp_path.is_dir()


def test_prepare_reports_a_failure_as_a_write_error(
    anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(SnapshotWriteError, match="cannot allocate a snapshot directory under"):
        prepare_snapshot_paths(anchor)


def test_commit_publishes_the_tmp_dir_atomically(anchor: Path, make_manifest: MakeManifest) -> None:
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    (tmp_path / "data_plane").mkdir()
    (tmp_path / "data_plane" / "rows.bin").write_bytes(b"rows")
    write_snapshot_manifest(tmp_path, make_manifest(mutation_version=7))
    commit_snapshot(tmp_path, final_path, keep_latest_k=2)
    assert not tmp_path.exists()
    assert (final_path / "data_plane" / "rows.bin").read_bytes() == b"rows"
    assert read_snapshot_manifest(final_path).mutation_version == 7


def test_retention_keeps_the_newest_k(anchor: Path, commit_one: CommitOne) -> None:
    for _ in range(5):
        commit_one(anchor, keep_latest_k=2)
    assert _names(anchor) == ["snapshot_000004", "snapshot_000005"]
    assert (
        anchor / "rollout_snapshots" / "snapshot_000005" / "payload.bin"
    ).read_bytes() == b"payload 5"


def test_apply_retention_returns_what_it_removed(anchor: Path, commit_one: CommitOne) -> None:
    paths = [commit_one(anchor, keep_latest_k=10) for _ in range(4)]
    assert _apply_retention(anchor / "rollout_snapshots", keep_latest_k=3) == paths[:1]
    assert _apply_retention(anchor / "rollout_snapshots", keep_latest_k=3) == []
    assert _names(anchor) == [p.name for p in paths[1:]]


def test_retention_failure_is_logged_and_the_commit_stands(
    anchor: Path,
    commit_one: CommitOne,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    commit_one(anchor)

    def broken_rename(src: Path, dst: Path) -> None:
        if "trash_" in str(dst):
            raise OSError(errno.EACCES, "Permission denied")
        os.replace(src, dst)

    monkeypatch.setattr(snapshot_dirs.os, "rename", broken_rename)
    with caplog.at_level(logging.WARNING, logger="rollvault.durable"):
        final_path = commit_one(anchor, keep_latest_k=1)
    assert final_path.is_dir()
    assert "pruning older snapshots failed: [Errno 13] Permission denied" in caplog.text
    assert str(final_path) in caplog.text


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "2"])
def test_commit_rejects_a_bad_keep_latest_k(anchor: Path, keep: object) -> None:
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    with pytest.raises(ValueError, match="keep_latest_k must be an integer >= 1"):
        commit_snapshot(tmp_path, final_path, keep_latest_k=keep)  # type: ignore[arg-type]


def test_commit_checks_its_paths(anchor: Path, tmp_path: Path) -> None:
    tmp_dir, final_path, _ = prepare_snapshot_paths(anchor)
    root = final_path.parent
    cases = [
        (root / "snapshot_000001", final_path, "commit source must be named tmp_snapshot_<seq>"),
        (tmp_dir, root / "final_1", "commit target must be named snapshot_<seq>"),
        (tmp_dir, tmp_path / "snapshot_000001", "must be in the same directory"),
        (tmp_dir, root / "snapshot_000002", "have different sequence numbers"),
        (root / "tmp_snapshot_000005", root / "snapshot_000005", "no such snapshot directory"),
    ]
    for source, target, message in cases:
        with pytest.raises(SnapshotLayoutError, match=message):
            commit_snapshot(source, target, keep_latest_k=1)
    final_path.mkdir()
    with pytest.raises(
        SnapshotLayoutError, match="already exists; sequence numbers are never reused"
    ):
        commit_snapshot(tmp_dir, final_path, keep_latest_k=1)
    assert tmp_dir.is_dir(), "a refused commit of unrecognised paths must not delete anything"


@pytest.mark.parametrize("content", [None, b"{}", b"not json"])
def test_commit_refuses_an_invalid_manifest_and_removes_the_tmp_dir(
    anchor: Path, commit_one: CommitOne, content: bytes | None
) -> None:
    previous = commit_one(anchor)
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    if content is not None:
        (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(SnapshotManifestError, match=f"refusing to commit {tmp_path}"):
        commit_snapshot(tmp_path, final_path, keep_latest_k=1)
    assert _names(anchor) == [previous.name]


def test_fsync_failure_removes_the_tmp_dir_and_keeps_the_previous_snapshot(
    anchor: Path,
    commit_one: CommitOne,
    make_manifest: MakeManifest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    previous = commit_one(anchor)
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    (tmp_path / "rows.bin").write_bytes(b"rows")
    write_snapshot_manifest(tmp_path, make_manifest())
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(
        SnapshotWriteError, match="No space left on device; the temporary directory was removed"
    ):
        commit_snapshot(tmp_path, final_path, keep_latest_k=1)
    assert _names(anchor) == [previous.name]
    assert (previous / "payload.bin").read_bytes() == b"payload 1"


def test_rename_failure_removes_the_tmp_dir(
    anchor: Path,
    commit_one: CommitOne,
    make_manifest: MakeManifest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    previous = commit_one(anchor)
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    write_snapshot_manifest(tmp_path, make_manifest())

    def failing_rename(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(snapshot_dirs.os, "rename", failing_rename)
    with pytest.raises(SnapshotWriteError, match=f"could not publish {final_path}"):
        commit_snapshot(tmp_path, final_path, keep_latest_k=1)
    assert _names(anchor) == [previous.name]


def test_parent_flush_failure_after_rename_keeps_the_complete_snapshot(
    anchor: Path, make_manifest: MakeManifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    write_snapshot_manifest(tmp_path, make_manifest())
    real = snapshot_dirs._fsync_directory

    def failing_parent(path: Path) -> None:
        if path == final_path.parent:
            raise OSError(errno.EIO, "Input/output error")
        real(path)

    monkeypatch.setattr(snapshot_dirs, "_fsync_directory", failing_parent)
    with pytest.raises(
        SnapshotWriteError, match="may not survive a power loss until the next commit"
    ):
        commit_snapshot(tmp_path, final_path, keep_latest_k=1)
    assert read_snapshot_manifest(final_path) == make_manifest()


def test_abort_removes_only_tmp_dirs(anchor: Path, commit_one: CommitOne) -> None:
    committed = commit_one(anchor)
    with pytest.raises(
        SnapshotLayoutError, match="refusing to remove, not a tmp_snapshot_<seq> path"
    ):
        abort_snapshot(committed)
    tmp_path, _, _ = prepare_snapshot_paths(anchor)
    abort_snapshot(tmp_path)
    assert _names(anchor) == [committed.name]


def test_publish_writes_payload_and_manifest_and_commits(
    anchor: Path, make_manifest: MakeManifest
) -> None:
    def write_rows(tmp: Path) -> None:
        (tmp / "rows.bin").write_bytes(b"r")

    final_path = publish_snapshot(
        anchor,
        manifest=make_manifest(mutation_version=3),
        write_payload=write_rows,
        keep_latest_k=1,
    )
    assert final_path.name == "snapshot_000001"
    assert (final_path / "rows.bin").read_bytes() == b"r"
    assert read_snapshot_manifest(final_path).mutation_version == 3


def test_publish_turns_a_write_failure_into_a_write_error(
    anchor: Path, commit_one: CommitOne, make_manifest: MakeManifest
) -> None:
    previous = commit_one(anchor)

    def disk_full(tmp: Path) -> None:
        (tmp / "rows.bin").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SnapshotWriteError, match="No space left on device; it was removed"):
        publish_snapshot(anchor, manifest=make_manifest(), write_payload=disk_full, keep_latest_k=1)
    assert _names(anchor) == [previous.name]


def test_publish_removes_the_tmp_dir_and_propagates_other_errors(
    anchor: Path, make_manifest: MakeManifest
) -> None:
    def buggy(tmp: Path) -> None:
        raise KeyError("bug in the caller")

    with pytest.raises(KeyError, match="bug in the caller"):
        publish_snapshot(anchor, manifest=make_manifest(), write_payload=buggy, keep_latest_k=1)
    assert _names(anchor) == []


def test_commit_flushes_everything_before_the_rename_and_the_parent_after(
    anchor: Path,
    commit_one: CommitOne,
    make_manifest: MakeManifest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commit_one(anchor)
    tmp_path, final_path, _ = prepare_snapshot_paths(anchor)
    (tmp_path / "data_plane").mkdir()
    (tmp_path / "data_plane" / "rows.bin").write_bytes(b"rows")
    write_snapshot_manifest(tmp_path, make_manifest())
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str | Path, dst: str | Path) -> None:
        events.append(("rename", f"{src} -> {dst}"))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    commit_snapshot(tmp_path, final_path, keep_latest_k=1)
    root = str(final_path.parent)
    flushed_before = {path for kind, path in events[:3]}
    assert flushed_before == {
        str(tmp_path / "data_plane" / "rows.bin"),
        str(tmp_path / "data_plane"),
        str(tmp_path / "manifest.json"),
    }
    assert events[3:6] == [
        ("fsync", str(tmp_path)),
        ("rename", f"{tmp_path} -> {final_path}"),
        ("fsync", root),
    ]
    old = final_path.parent / "snapshot_000001"
    assert events[6:] == [("rename", f"{old} -> {root}/trash_snapshot_000001"), ("fsync", root)]
    assert _names(anchor) == [final_path.name]


def test_prepare_claims_a_leftover_by_rename_when_mkdir_finds_no_space(
    anchor: Path, commit_one: CommitOne, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = commit_one(anchor)
    root = anchor / "rollout_snapshots"
    (root / "tmp_snapshot_000002").mkdir()
    (root / "tmp_snapshot_000002" / "rows.bin").write_bytes(b"x" * 4096)
    (root / "trash_snapshot_000001").mkdir()
    (root / "trash_snapshot_000001" / "payload.bin").write_bytes(b"old")
    real_mkdir = Path.mkdir

    def full_disk_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self.name.startswith("tmp_snapshot_"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", full_disk_mkdir)
    tmp_path, final_path, sequence = prepare_snapshot_paths(anchor)
    assert sequence == 3
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []
    assert _names(anchor) == [previous.name, "tmp_snapshot_000003"]
    assert (previous / "payload.bin").read_bytes() == b"payload 1"


def test_prepare_without_leftovers_reports_a_full_disk(
    anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    prepare_snapshot_paths(anchor)  # creates rollout_snapshots/ while there is space
    abort_snapshot(anchor / "rollout_snapshots" / "tmp_snapshot_000001")
    monkeypatch.setattr(Path, "mkdir", full_disk_mkdir)
    with pytest.raises(SnapshotWriteError, match="cannot allocate.*No space left on device"):
        prepare_snapshot_paths(anchor)


def _payload(size: int) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / "rows.bin").write_bytes(os.urandom(size))

    return write


def test_on_a_full_filesystem_leftovers_are_freed_before_the_payload_and_a_retry_succeeds(
    small_filesystem: Callable[[int], Path], make_manifest: MakeManifest
) -> None:
    anchor = small_filesystem(1 << 20) / "bootstrap"
    anchor.mkdir()
    first = publish_snapshot(
        anchor, manifest=make_manifest(), write_payload=_payload(200_000), keep_latest_k=2
    )
    # A crashed earlier write left 600 kB behind: the next snapshot fits only without it.
    leftover = anchor / "rollout_snapshots" / "tmp_snapshot_000002"
    leftover.mkdir()
    (leftover / "rows.bin").write_bytes(os.urandom(600_000))
    second = publish_snapshot(
        anchor, manifest=make_manifest(), write_payload=_payload(500_000), keep_latest_k=2
    )
    assert _names(anchor) == [first.name, second.name]
    # Too big for what is left: the write fails, the committed snapshots stay as they were.
    with pytest.raises(SnapshotWriteError, match="No space left on device"):
        publish_snapshot(
            anchor, manifest=make_manifest(), write_payload=_payload(400_000), keep_latest_k=2
        )
    assert _names(anchor) == [first.name, second.name]
    assert read_snapshot_manifest(second) == make_manifest()
    # The failed attempt took its partial files with it: a smaller retry fits.
    third = publish_snapshot(
        anchor, manifest=make_manifest(), write_payload=_payload(200_000), keep_latest_k=2
    )
    assert _names(anchor) == [second.name, third.name]
