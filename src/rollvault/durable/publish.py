"""Writing one snapshot end to end: allocate, write, commit, clean up on failure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.manifest_schema import RolloutSnapshotManifest, write_snapshot_manifest
from rollvault.durable.snapshot_dirs import abort_snapshot, commit_snapshot, prepare_snapshot_paths


def publish_snapshot(
    anchor: Path,
    *,
    manifest: RolloutSnapshotManifest,
    write_payload: Callable[[Path], None],
    keep_latest_k: int,
) -> Path:
    """Write a snapshot under ``anchor`` and commit it; return the committed path.

    ``write_payload(tmp_path)`` writes the snapshot's files (sidecars, data
    plane rows) into the temporary directory without flushing them; the
    manifest is written after it and the commit flushes everything. If
    ``write_payload`` or the manifest write raises ``OSError`` (disk full, I/O
    error) the temporary directory is removed and ``SnapshotWriteError`` is
    raised; any other exception also removes it and propagates unchanged.
    Earlier snapshots are untouched in every case.
    """
    tmp_path, final_path, _sequence = prepare_snapshot_paths(anchor)
    try:
        write_payload(tmp_path)
        write_snapshot_manifest(tmp_path, manifest)
    except OSError as exc:
        abort_snapshot(tmp_path)
        raise SnapshotWriteError(
            f"writing snapshot {tmp_path} failed: {exc}; it was removed and earlier "
            "snapshots are untouched"
        ) from exc
    except BaseException:
        abort_snapshot(tmp_path)
        raise
    commit_snapshot(tmp_path, final_path, keep_latest_k=keep_latest_k)
    return final_path
