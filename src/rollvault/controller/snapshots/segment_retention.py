"""Which segments an anchor's kept snapshots reference, and collecting the rest.

Runs after every committed snapshot, in the checkpointer's worker thread and
under its lock, so no other snapshot is being written meanwhile: the snapshot
retention has already pruned the old snapshots, and every segment that no
remaining committed snapshot's ``data_plane/metadata.json`` lists (nor the
writer's base, the newest of them) is deleted
(:func:`rollvault.durable.segment_store.delete_unreferenced`). If any committed
snapshot's index cannot be read, what it references is unknown: nothing is
deleted, and a warning says why (retention prunes that snapshot in time).
"""

from __future__ import annotations

import logging
from collections.abc import Set
from pathlib import Path

from rollvault.controller.snapshots.snapshot_files import DATA_PLANE_DIRNAME
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.segmented import referenced_segments
from rollvault.dataplane.segments import SEGMENT_FILE_SUFFIX
from rollvault.durable.layout import SEGMENTS_DIRNAME
from rollvault.durable.segment_store import delete_unreferenced
from rollvault.durable.snapshot_dirs import committed_snapshot_paths

_LOG = logging.getLogger("rollvault.checkpointer")


def is_segment_file(name: str) -> bool:
    """A segment, or the temporary a crashed ``atomic_write_bytes`` of one left."""
    return name.endswith(SEGMENT_FILE_SUFFIX) or (
        name.startswith(".") and f"{SEGMENT_FILE_SUFFIX}.tmp." in name
    )


def collect_segments(root: Path, *, also_keep: Set[str] = frozenset()) -> list[str] | None:
    """Delete the segments of ``root`` (a ``rollout_snapshots/``) no committed snapshot uses.

    ``also_keep`` are segments the caller still needs. Returns the names
    deleted, or None when an unreadable index made it delete nothing.
    """
    committed = committed_snapshot_paths(root)
    try:
        referenced = referenced_segments([path / DATA_PLANE_DIRNAME for path in committed])
    except DataPlaneCheckpointError as exc:
        _LOG.warning("kept every segment under %s: %s", root / SEGMENTS_DIRNAME, exc)
        return None
    return delete_unreferenced(
        root / SEGMENTS_DIRNAME, referenced | also_keep, is_segment=is_segment_file
    )
