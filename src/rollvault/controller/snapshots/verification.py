"""Verifying one rollout snapshot: its files, and every cross-reference between them.

A snapshot is *verified* when every sidecar matches what the data plane's
metadata advertises and every cross-reference holds (each ledger staging key
and each canonical row exists). A failed check raises
:class:`SnapshotCorruptError` naming the file, so that restore falls back to
an older snapshot.
"""

from __future__ import annotations

from pathlib import Path

from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    LoadedSnapshot,
    SnapshotCorruptError,
    read_snapshot_files,
)
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, train_key
from rollvault.durable.manifest_schema import RolloutSnapshotManifest
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME


def read_snapshot(
    path: Path, manifest: RolloutSnapshotManifest, *, generations_per_group: int
) -> LoadedSnapshot:
    """Read and verify every file of the snapshot at ``path``.

    Raises :class:`SnapshotCorruptError` naming the first bad file.
    """
    snapshot = read_snapshot_files(path, manifest)
    _check_cross_references(snapshot, generations_per_group)
    return snapshot


def _check_cross_references(snapshot: LoadedSnapshot, generations_per_group: int) -> None:
    staging = snapshot.data_plane.partitions.get(STAGING_PARTITION, {})
    train = snapshot.data_plane.partitions.get(TRAIN_PARTITION, {})
    origins = snapshot.controller.origins
    for group in snapshot.recovery.ledger_state["groups"]:
        group_id = group["group_id"]
        if group_id not in origins:
            raise SnapshotCorruptError(
                snapshot.path / CONTROLLER_STATE_FILENAME,
                f"no origin for ledger group {group_id!r}",
            )
        for sibling in group["siblings"]:
            attempt = sibling["attempts"][-1]
            missing = [key for key in attempt["staging_keys"] if key not in staging]
            if attempt["status"] == "sealed" and missing:
                raise SnapshotCorruptError(
                    snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME,
                    f"group {group_id!r} sibling {sibling['generation_index']} names staged rows "
                    f"{missing} that data_plane/ does not hold",
                )
    for entry in snapshot.replay.replay.entries:
        missing = [
            train_key(entry.group_id, index)
            for index in range(generations_per_group)
            if train_key(entry.group_id, index) not in train
        ]
        if missing or entry.group_id not in snapshot.replay.canonical_attempts:
            raise SnapshotCorruptError(
                snapshot.path / REPLAY_BUFFER_METADATA_FILENAME,
                f"canonical group {entry.group_id!r} lacks rows {missing} or its attempt ids",
            )
        if entry.group_id not in origins:
            raise SnapshotCorruptError(
                snapshot.path / CONTROLLER_STATE_FILENAME,
                f"no origin for canonical group {entry.group_id!r}",
            )
