"""Snapshot directories under an anchor: sequence numbers, commit and retention.

A snapshot is written into ``tmp_snapshot_<seq>/`` and published by one
rename to ``snapshot_<seq>/``; old ones are renamed to
``trash_snapshot_<seq>/`` before they are deleted. A rename is atomic, so at
any instant every ``snapshot_<seq>`` directory is complete, and a crash at any
step leaves the previous snapshot or the new one. Nothing reads ``tmp_`` or
``trash_`` directories; ``prepare_snapshot_paths`` removes them before the new
snapshot writes anything, so that on a full disk their space is free for it.

Sequence numbers are never reused: the next one is one more than the largest
found among committed, temporary and trash names. Names are zero-padded to six
digits when written and parsed with any number of digits.

One writer per anchor (the controller) is assumed.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Final

from rollvault.durable.errors import SnapshotLayoutError, SnapshotManifestError, SnapshotWriteError
from rollvault.durable.faults import fault_point
from rollvault.durable.fsync import _fsync_directory, _fsync_tree
from rollvault.durable.layout import ROLLOUT_SNAPSHOTS_DIRNAME
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.retention import (
    PruneFaultPoints,
    beyond_latest,
    check_keep_latest_k,
    prune_through_trash,
)
from rollvault.durable.trash import remove_tree

_LOG = logging.getLogger("rollvault.durable")

_SNAPSHOT_RE: Final = re.compile(r"snapshot_([0-9]+)")
_TMP_SNAPSHOT_RE: Final = re.compile(r"tmp_snapshot_([0-9]+)")
_TRASH_SNAPSHOT_RE: Final = re.compile(r"trash_snapshot_([0-9]+)")
_SEQUENCE_DIGITS: Final = 6
SNAPSHOT_RETENTION_POINTS: Final = PruneFaultPoints(
    before_rename=lambda: fault_point("retention.before_trash_rename"),
    after_rename=lambda: fault_point("retention.after_trash_rename"),
    synced=lambda: fault_point("retention.trash_synced"),
    before_delete=lambda: fault_point("retention.before_trash_delete"),
    after_delete=lambda: fault_point("retention.after_trash_delete"),
)


def _snapshot_sequence(path: Path) -> int:
    """Return the sequence number of a committed, temporary or trash snapshot path."""
    for pattern in (_SNAPSHOT_RE, _TMP_SNAPSHOT_RE, _TRASH_SNAPSHOT_RE):
        match = pattern.fullmatch(path.name)
        if match is not None:
            return int(match.group(1))
    raise SnapshotLayoutError(
        f"{path}: not a snapshot directory name "
        "(expected snapshot_<seq>, tmp_snapshot_<seq> or trash_snapshot_<seq>)"
    )


def snapshots_root(anchor: Path) -> Path:
    """The ``rollout_snapshots`` directory of an anchor."""
    return anchor / ROLLOUT_SNAPSHOTS_DIRNAME


def committed_snapshot_paths(root: Path) -> list[Path]:
    """Committed ``snapshot_<seq>`` entries of ``root``, oldest first; ``[]`` if none."""
    if not root.is_dir():
        return []
    found = [entry for entry in root.iterdir() if _SNAPSHOT_RE.fullmatch(entry.name)]
    return sorted(found, key=lambda entry: (_snapshot_sequence(entry), entry.name))


def _is_leftover(name: str) -> bool:
    return bool(_TMP_SNAPSHOT_RE.fullmatch(name) or _TRASH_SNAPSHOT_RE.fullmatch(name))


def _next_sequence(names: list[str]) -> int:
    sequences = [_snapshot_sequence(Path(name)) for name in names if _is_any_snapshot_name(name)]
    return max(sequences, default=0) + 1


def _is_any_snapshot_name(name: str) -> bool:
    return bool(_SNAPSHOT_RE.fullmatch(name)) or _is_leftover(name)


def _ensure_root(anchor: Path) -> Path:
    if not anchor.is_dir():
        raise SnapshotLayoutError(f"anchor directory {anchor} does not exist")
    root = snapshots_root(anchor)
    if not root.is_dir():
        root.mkdir()
        _fsync_directory(anchor)
    return root


def _clear_leftovers(root: Path, leftovers: list[Path]) -> None:
    """Delete tmp_ and trash_ directories of a crashed or failed earlier write.

    A failure only costs disk space (nothing reads them), so it is logged and
    retried by the next prepare rather than failing the new snapshot.
    """
    for leftover in leftovers:
        fault_point("prepare.before_leftover_delete")
        try:
            remove_tree(leftover)
        except OSError as exc:
            _LOG.warning("could not remove leftover snapshot directory %s: %s", leftover, exc)
            continue
        fault_point("prepare.after_leftover_delete")
    if leftovers:
        try:
            _fsync_directory(root)
        except OSError as exc:
            # Only the deletions' durability is at stake: a leftover that comes
            # back after a power loss is deleted again by the next prepare.
            _LOG.warning("could not flush %s after removing leftovers: %s", root, exc)


def _claim_tmp_dir(tmp_path: Path, leftovers: list[Path]) -> Path | None:
    """Create ``tmp_path``: by renaming a leftover directory when there is one.

    Returns the leftover renamed (its old contents are still in ``tmp_path``),
    or None when the directory was made anew. A rename needs no free space,
    where a mkdir may need a block the full disk does not have.
    """
    for leftover in leftovers:
        if leftover.is_dir() and not leftover.is_symlink():
            os.rename(leftover, tmp_path)
            return leftover
    tmp_path.mkdir()
    return None


def _empty_claimed_dir(tmp_path: Path, claimed: Path) -> None:
    """Delete what the leftover renamed to ``tmp_path`` held; abort the snapshot on failure."""
    try:
        for child in sorted(tmp_path.iterdir()):
            fault_point("prepare.before_leftover_delete")
            remove_tree(child)
            fault_point("prepare.after_leftover_delete")
    except OSError as exc:
        abort_snapshot(tmp_path)
        raise SnapshotWriteError(
            f"cannot empty {tmp_path} (the leftover {claimed.name}, renamed): {exc}"
        ) from exc


def prepare_snapshot_paths(anchor: Path) -> tuple[Path, Path, int]:
    """Allocate the next temporary/final snapshot directory pair.

    Creates ``<anchor>/rollout_snapshots/tmp_snapshot_<seq>/`` (empty) and returns
    ``(tmp_path, final_path, seq)``. The ``tmp_`` and ``trash_`` leftovers of
    crashed or failed earlier writes are deleted first, so that on a full disk
    their space is free before the new snapshot writes a byte. The new name is
    made durable before anything is deleted, so no sequence number that ever
    appeared on disk is handed out again: when a leftover exists, the new
    directory is that leftover renamed (which needs no free space), emptied
    with the others. Raises ``SnapshotWriteError`` when the directory cannot
    be created or emptied.
    """
    try:
        root = _ensure_root(anchor)
        names = sorted(entry.name for entry in root.iterdir())
        sequence = _next_sequence(names)
        tmp_path = root / f"tmp_snapshot_{sequence:0{_SEQUENCE_DIGITS}d}"
        final_path = root / f"snapshot_{sequence:0{_SEQUENCE_DIGITS}d}"
        leftovers = [root / name for name in names if _is_leftover(name)]
        claimed = _claim_tmp_dir(tmp_path, leftovers)
        fault_point("prepare.tmp_created")
        _fsync_directory(root)
        fault_point("prepare.parent_synced")
    except OSError as exc:
        raise SnapshotWriteError(
            f"cannot allocate a snapshot directory under {anchor}: {exc}"
        ) from exc
    if claimed is not None:
        _empty_claimed_dir(tmp_path, claimed)
    _clear_leftovers(root, [path for path in leftovers if path != claimed])
    return tmp_path, final_path, sequence


def abort_snapshot(tmp_path: Path) -> None:
    """Remove an unpublished ``tmp_snapshot_<seq>`` directory after a failure.

    A failure to remove it is logged, not raised: the caller is already
    reporting the error that made it abort, and the next prepare retries.
    """
    if not _TMP_SNAPSHOT_RE.fullmatch(tmp_path.name):
        raise SnapshotLayoutError(f"{tmp_path}: refusing to remove, not a tmp_snapshot_<seq> path")
    try:
        remove_tree(tmp_path)
    except OSError as exc:
        _LOG.warning("could not remove unpublished snapshot %s: %s", tmp_path, exc)


def _check_commit_paths(tmp_path: Path, final_path: Path) -> None:
    if not _TMP_SNAPSHOT_RE.fullmatch(tmp_path.name):
        raise SnapshotLayoutError(f"{tmp_path}: commit source must be named tmp_snapshot_<seq>")
    if not _SNAPSHOT_RE.fullmatch(final_path.name):
        raise SnapshotLayoutError(f"{final_path}: commit target must be named snapshot_<seq>")
    if tmp_path.parent != final_path.parent:
        raise SnapshotLayoutError(
            f"{tmp_path} and {final_path} must be in the same directory (a rename "
            "across directories is not one atomic step)"
        )
    if _snapshot_sequence(tmp_path) != _snapshot_sequence(final_path):
        raise SnapshotLayoutError(f"{tmp_path} and {final_path} have different sequence numbers")
    if not tmp_path.is_dir():
        raise SnapshotLayoutError(f"{tmp_path}: no such snapshot directory to commit")
    if os.path.lexists(final_path):
        raise SnapshotLayoutError(f"{final_path} already exists; sequence numbers are never reused")


def _validate_before_publish(tmp_path: Path) -> None:
    try:
        read_snapshot_manifest(tmp_path)
    except SnapshotManifestError as exc:
        abort_snapshot(tmp_path)
        raise SnapshotManifestError(f"refusing to commit {tmp_path}: {exc}") from exc
    fault_point("commit.manifest_validated")


def _flush_and_rename(tmp_path: Path, final_path: Path) -> None:
    try:
        _fsync_tree(tmp_path)
        fault_point("commit.tree_synced")
        fault_point("commit.before_rename")
        os.rename(tmp_path, final_path)
    except (OSError, SnapshotLayoutError) as exc:
        abort_snapshot(tmp_path)
        raise SnapshotWriteError(
            f"could not publish {final_path}: {exc}; the temporary directory was "
            "removed and earlier snapshots are untouched"
        ) from exc
    fault_point("commit.after_rename")


def _flush_publication(final_path: Path) -> None:
    try:
        _fsync_directory(final_path.parent)
    except OSError as exc:
        raise SnapshotWriteError(
            f"published {final_path} but flushing {final_path.parent} failed: {exc}; the "
            "snapshot is complete but may not survive a power loss until the next commit"
        ) from exc
    fault_point("commit.parent_synced")


def commit_snapshot(tmp_path: Path, final_path: Path, *, keep_latest_k: int) -> None:
    """Atomically publish one validated snapshot and retain recent fallbacks.

    Checks that ``tmp_path`` holds a valid ``manifest.json``, flushes every file
    and directory of it, renames it to ``final_path``, flushes the parent, then
    keeps the newest ``keep_latest_k`` committed snapshots (older ones go
    through ``trash_snapshot_<seq>``). On failure before the rename the
    temporary directory is removed and ``SnapshotWriteError`` (or
    ``SnapshotManifestError`` for a bad manifest) is raised; earlier snapshots
    are untouched. A failure while pruning is logged: the commit stands.
    """
    check_keep_latest_k(keep_latest_k)
    _check_commit_paths(tmp_path, final_path)
    _validate_before_publish(tmp_path)
    _flush_and_rename(tmp_path, final_path)
    _flush_publication(final_path)
    try:
        _apply_retention(final_path.parent, keep_latest_k=keep_latest_k)
    except OSError as exc:
        _LOG.warning(
            "committed %s, but pruning older snapshots failed: %s; the next commit retries",
            final_path,
            exc,
        )


def _apply_retention(root: Path, *, keep_latest_k: int) -> list[Path]:
    """Keep the newest ``keep_latest_k`` committed snapshots; return the removed ones.

    Every excess snapshot is renamed to ``trash_`` and the renames are flushed
    before anything is deleted, so a crash never leaves a half-deleted
    directory under a committed name.
    """
    committed = [path for path in committed_snapshot_paths(root) if path.is_dir()]
    excess = beyond_latest(committed, keep_latest_k=keep_latest_k)
    prune_through_trash(root, excess, points=SNAPSHOT_RETENTION_POINTS)
    return excess
