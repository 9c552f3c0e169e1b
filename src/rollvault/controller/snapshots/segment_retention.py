"""Which segments an anchor's kept snapshots reference, and collecting the rest.

Runs after every committed snapshot, in the checkpointer's worker thread and
under its lock, so no other snapshot is being written meanwhile: the snapshot
retention has already pruned the old snapshots, and every segment that no
remaining committed snapshot's ``data_plane/metadata.json`` lists (nor the
writer's base, the newest of them) is deleted, and so are the row segments'
catalogs no such index lists
(:func:`rollvault.durable.segment_store.delete_unreferenced`). Ledger segments
the same way: one is deleted only when no remaining committed snapshot's
``rollout_recovery.json`` (version 6: an index of them) lists it, and fact
segments when no remaining committed snapshot's ``group_facts.json`` does. If
any committed snapshot's index cannot be read, what it references is unknown:
nothing is deleted, and a warning says why (retention prunes that snapshot in
time).
"""

from __future__ import annotations

import logging
from collections.abc import Set
from pathlib import Path

from rollvault.controller.snapshots.fact_forms import FACT_SEGMENT_SUFFIXES
from rollvault.controller.snapshots.fact_index import (
    GROUP_FACTS_FILENAME,
    FactsError,
    referenced_fact_segments,
)
from rollvault.controller.snapshots.snapshot_files import DATA_PLANE_DIRNAME, SnapshotCorruptError
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.segment_catalog import CATALOG_FILE_SUFFIX
from rollvault.dataplane.segmented_index import referenced_segments
from rollvault.dataplane.segments import SEGMENT_FILE_SUFFIX
from rollvault.durable.layout import SEGMENTS_DIRNAME
from rollvault.durable.segment_store import delete_unreferenced
from rollvault.durable.snapshot_dirs import committed_snapshot_paths
from rollvault.ledger.errors import LedgerError
from rollvault.ledger.indexed_sidecar import (
    INDEXED_SIDECAR_SCHEMA_VERSION,
    referenced_ledger_segment_files,
    sidecar_file_version,
)
from rollvault.ledger.ledger_records import LEDGER_SEGMENT_SUFFIXES
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME

_LOG = logging.getLogger("rollvault.checkpointer")


def is_segment_file(name: str) -> bool:
    """A row, ledger or fact segment, a row segments' catalog, or the temporary a crashed
    ``atomic_write_bytes`` of one left."""
    suffixes = (
        SEGMENT_FILE_SUFFIX,
        CATALOG_FILE_SUFFIX,
        *LEDGER_SEGMENT_SUFFIXES,
        *FACT_SEGMENT_SUFFIXES,
    )
    return any(
        name.endswith(suffix) or (name.startswith(".") and f"{suffix}.tmp." in name)
        for suffix in suffixes
    )


def referenced_group_fact_segments(snapshot_dirs: list[Path]) -> set[str]:
    """Fact segment files any of ``snapshot_dirs`` references (those before group facts: none).

    Raises :class:`SnapshotCorruptError` if an index cannot be read or decoded.
    """
    files: set[str] = set()
    for directory in snapshot_dirs:
        path = directory / GROUP_FACTS_FILENAME
        # Absent: written before group facts (or damaged: verification names the missing
        # file the data plane's metadata advertises): it references no fact segment.
        data = _read_if_present(path)
        if data is None:
            continue
        try:
            files |= referenced_fact_segments(path, data)
        except FactsError as exc:
            raise SnapshotCorruptError(exc.path, exc.problem) from exc
    return files


def referenced_ledger_segments(snapshot_dirs: list[Path]) -> set[str]:
    """Ledger segment files any of ``snapshot_dirs`` references (sidecars before 6: none).

    A snapshot without a sidecar references none (it cannot be restored). Raises
    :class:`SnapshotCorruptError` if a sidecar cannot be read or decoded.
    """
    files: set[str] = set()
    for directory in snapshot_dirs:
        path = directory / ROLLOUT_RECOVERY_STATE_FILENAME
        # Absent: without its sidecar the snapshot can never be restored (verification
        # names the missing file), so no segment is needed for it.
        data = _read_if_present(path)
        if data is None:
            continue
        version = sidecar_file_version(data)
        if version is None:
            raise SnapshotCorruptError(path, "no schema_version (not a ledger sidecar)")
        if version < INDEXED_SIDECAR_SCHEMA_VERSION:
            continue
        try:
            files |= referenced_ledger_segment_files(data)
        except LedgerError as exc:
            raise SnapshotCorruptError(path, str(exc)) from exc
    return files


def _read_if_present(path: Path) -> bytes | None:
    """``path``'s bytes, None if it does not exist; raises :class:`SnapshotCorruptError` if
    it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotCorruptError(path, f"cannot read: {exc.strerror or exc}") from exc


def collect_segments(root: Path, *, also_keep: Set[str] = frozenset()) -> list[str] | None:
    """Delete the segments of ``root`` (a ``rollout_snapshots/``) no committed snapshot uses.

    ``also_keep`` are segments the caller still needs. Returns the names
    deleted, or None when an unreadable index made it delete nothing.
    """
    committed = committed_snapshot_paths(root)
    try:
        referenced = referenced_segments([path / DATA_PLANE_DIRNAME for path in committed])
        referenced |= referenced_ledger_segments(committed)
        referenced |= referenced_group_fact_segments(committed)
    except (DataPlaneCheckpointError, SnapshotCorruptError) as exc:
        _LOG.warning("kept every segment under %s: %s", root / SEGMENTS_DIRNAME, exc)
        return None
    return delete_unreferenced(
        root / SEGMENTS_DIRNAME, referenced | also_keep, is_segment=is_segment_file
    )
