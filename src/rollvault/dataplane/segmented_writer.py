"""Writing incremental data-plane checkpoints: new rows into segments, ``metadata.json`` version 5.

:class:`SegmentedWriter` writes successive checkpoints of one store into one
segments directory. It remembers, for the last checkpoint it *committed*
(:meth:`SegmentedWriter.committed`), each key's row token
(:meth:`~rollvault.dataplane.capture.DataPlaneCapture.row_tokens`) and where
the row is; the next checkpoint writes one new segment per partition with
only the rows whose token changed (new keys, or keys cleared and put again),
and references the rest. A checkpoint that fails or is never committed
leaves its segment unreferenced, for garbage collection driven by
:func:`~rollvault.dataplane.segmented_index.referenced_segments`; the writer's
memory still describes the last committed one, so the next try writes those rows
again.

Segments are named after the checkpoint that wrote them (the caller's
``stem``: the snapshot's sequence number, higher than any snapshot's on disk),
not after their content: a name tells which snapshot wrote the file, needs no
hashing before the write, and no committed snapshot can reference a name that
is being written (an orphan of a failed try at the same number is replaced,
see :func:`~rollvault.durable.segment_store.publish_segment`). Content
addressing would only pay off for identical segments, and a segment holds the
rows new since the previous snapshot, so two are never identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import (
    DATA_PLANE_SCHEMA_VERSION,
    METADATA_FILENAME,
    encode_envelope,
)
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.live_ordinals import encode_live
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.segment_catalog import (
    WrittenCatalog,
    catalog_file_name,
    catalog_name_field,
    plan_catalogs,
    segment_name_field,
    write_catalog,
)
from rollvault.dataplane.segmented import LoadedSegmented
from rollvault.dataplane.segmented_format import (
    CatalogRef,
    HeldEntryV4,
    SegmentedCheckpointContentV5,
    WholeRun,
)
from rollvault.dataplane.segments import (
    WrittenSegment,
    segment_file_name,
    write_segment,
)
from rollvault.durable.index_runs import (
    in_a_run,
    keyed_runs,
)


@dataclass(frozen=True)
class SegmentedWriteInfo:
    """What one :meth:`SegmentedWriter.write` did."""

    bytes_written: int
    """``metadata.json`` plus the new segments and catalog."""
    segment_bytes: int
    new_rows: int
    new_row_bytes: int
    """The new rows' own bytes: arrays, 8 per int or float scalar, 1 per bool, UTF-8 keys."""
    row_counts: dict[str, int]
    referenced: tuple[str, ...]
    """Segment files the checkpoint references."""
    catalog_bytes: int = 0
    """The new catalog's bytes (0 when none was written)."""
    catalogs: tuple[str, ...] = ()
    """Catalog files the checkpoint lists."""


@dataclass(frozen=True)
class _Location:
    token: object
    segment: str
    ordinal: int


@dataclass(frozen=True)
class RowPlan:
    """What :meth:`SegmentedWriter.write` writes for one capture (:meth:`SegmentedWriter.plan`)."""

    kept: dict[str, dict[str, _Location]]
    """Per partition, the rows the last committed checkpoint holds unchanged, where they are."""
    fresh: dict[str, dict[str, RowView]]
    """Per partition with any, the rows to write (new keys, or keys put again)."""
    tokens: dict[str, Mapping[str, object]]
    new_row_bytes: int
    """The fresh rows' own bytes (:func:`row_bytes`)."""
    base: object
    """The writer's memory it was planned against (a plan is refused once that changed)."""


@dataclass
class PendingCheckpoint:
    """A written checkpoint the writer adopts as its base once it is committed."""

    locations: dict[str, dict[str, _Location]]
    segments: dict[str, WrittenSegment]
    info: SegmentedWriteInfo
    catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)


@dataclass
class SegmentedWriter:
    """Writes incremental checkpoints of one store into ``segments_dir`` (one writer per dir)."""

    segments_dir: Path
    last_written: PendingCheckpoint | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _locations: dict[str, dict[str, _Location]] = field(default_factory=dict)
    _segments: dict[str, WrittenSegment] = field(default_factory=dict)
    _catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
    """The catalogs the last committed checkpoint lists."""

    def plan(self, capture: DataPlaneCapture) -> RowPlan:
        """Which of ``capture``'s rows the next :meth:`write` writes, and their bytes.

        Nothing is written: a snapshot plans its rows first so that it knows their
        bytes before its other writers run (the fact segments' optional merges are
        capped by the room those bytes leave, see
        :func:`~rollvault.controller.snapshots.write_budget.headroom`)."""
        kept: dict[str, dict[str, _Location]] = {}
        fresh: dict[str, dict[str, RowView]] = {}
        tokens: dict[str, Mapping[str, object]] = {}
        new_row_bytes = 0
        for partition in capture.partitions():
            previous = self._locations.get(partition, {})
            tokens[partition] = capture.row_tokens(partition)
            kept[partition] = {
                key: previous[key]
                for key, token in tokens[partition].items()
                if key in previous and previous[key].token is token
            }
            fresh_keys = [key for key in tokens[partition] if key not in kept[partition]]
            if fresh_keys:
                fresh[partition] = capture.select(partition, fresh_keys)
                new_row_bytes += sum(row_bytes(k, row) for k, row in fresh[partition].items())
        return RowPlan(kept, fresh, tokens, new_row_bytes, base=self._locations)

    def write(
        self,
        directory: Path,
        capture: DataPlaneCapture,
        user_metadata: dict[str, Any],
        *,
        stem: str,
        plan: RowPlan | None = None,
    ) -> PendingCheckpoint:
        """Write new rows as segments named after ``stem``, then ``directory/metadata.json``.

        ``user_metadata`` must already be checked JSON. ``plan`` is :meth:`plan` of
        ``capture`` made since the last :meth:`committed` (planned here without one).
        Segments are durable when this returns; ``metadata.json`` is not flushed (the
        snapshot's commit does it). Call :meth:`committed` once the checkpoint is committed.
        """
        if plan is None:
            plan = self.plan(capture)
        elif plan.base is not self._locations:
            raise ValueError("the row plan was made before the writer's last committed checkpoint")
        directory.mkdir(exist_ok=True)
        leftovers = sorted(entry.name for entry in directory.iterdir())
        if leftovers:
            raise DataPlaneCheckpointError(
                directory, f"checkpoint directory is not empty (holds {leftovers})"
            )
        locations: dict[str, dict[str, _Location]] = {}
        segments: dict[str, WrittenSegment] = {}
        new_rows = segment_bytes = 0
        for partition in capture.partitions():
            kept = dict(plan.kept[partition])
            rows = plan.fresh.get(partition)
            if rows:
                file = segment_file_name(stem, partition)
                written = write_segment(self.segments_dir, file, partition, rows)
                segments[file] = written
                segment_bytes += written.byte_size
                new_rows += len(rows)
                tokens = plan.tokens[partition]
                for ordinal, key in enumerate(written.keys):
                    kept[key] = _Location(tokens[key], file, ordinal)
            locations[partition] = kept
        known = {**self._segments, **segments}
        partition_names = capture.partitions()
        held = _held(locations)
        catalogs, catalog_bytes = self._catalogs_for(held, known, stem)
        index = {name: position for position, name in enumerate(partition_names)}
        entries = [
            HeldEntryV4(
                name=segment_name_field(file, known[file].partition),
                partition=index[known[file].partition],
                live=encode_live(known[file].row_count, ordinals),
            )
            for file, ordinals in sorted(held.items())
        ]
        content = SegmentedCheckpointContentV5(
            partitions=partition_names,
            catalogs=[_catalog_ref(catalogs[file]) for file in sorted(catalogs)],
            whole=_whole_runs(entries),
            segments=[entry for entry in entries if not in_a_run(entry)],
            user_metadata=user_metadata,
        )
        metadata = encode_envelope(msgspec.json.encode(content), DATA_PLANE_SCHEMA_VERSION)
        with open(directory / METADATA_FILENAME, "xb") as handle:
            handle.write(metadata)
        info = SegmentedWriteInfo(
            bytes_written=len(metadata) + segment_bytes + catalog_bytes,
            segment_bytes=segment_bytes,
            new_rows=new_rows,
            new_row_bytes=plan.new_row_bytes,
            row_counts=capture.row_counts(),
            referenced=tuple(sorted(held)),
            catalog_bytes=catalog_bytes,
            catalogs=tuple(sorted(catalogs)),
        )
        used = {file: known[file] for file in held}
        self.last_written = PendingCheckpoint(
            locations=locations, segments=used, info=info, catalogs=catalogs
        )
        return self.last_written

    def _catalogs_for(
        self, held: Mapping[str, object], known: Mapping[str, WrittenSegment], stem: str
    ) -> tuple[dict[str, WrittenCatalog], int]:
        """The catalogs describing the ``held`` segments, and the bytes of the one written.

        A held segment no committed catalog describes (new, or restored from an index
        before catalogs) goes into a new catalog named after ``stem``, durable when this
        returns, and so do the live entries of the catalogs merged to keep at most
        :data:`~rollvault.dataplane.segment_catalog.MAX_CATALOGS` listed. A catalog
        none of whose segments is held is no longer listed.
        """
        plan = plan_catalogs(self._catalogs, held)
        catalogs = plan.kept
        if not plan.moving:
            return catalogs, 0
        written = write_catalog(
            self.segments_dir, catalog_file_name(stem), [known[file] for file in plan.moving]
        )
        catalogs[written.file] = written
        return catalogs, written.byte_size

    def committed(self, pending: PendingCheckpoint) -> None:
        """Make ``pending`` the base of the next checkpoint: it is committed now."""
        self._locations = pending.locations
        self._segments = pending.segments
        self._catalogs = pending.catalogs
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Segment and catalog files the last committed checkpoint references."""
        return set(self._segments) | set(self._catalogs)

    def seed(self, capture: DataPlaneCapture, loaded: LoadedSegmented) -> None:
        """Take the checkpoint a store was just loaded from as the base of the next one.

        ``capture`` must be taken right after the load, before anything else
        changed the store, so each token stands for the loaded row.
        """
        locations: dict[str, dict[str, _Location]] = {}
        for partition in capture.partitions():
            tokens = capture.row_tokens(partition)
            where = loaded.locations.get(partition, {})
            locations[partition] = {
                key: _Location(token, *where[key]) for key, token in tokens.items() if key in where
            }
        self._locations = locations
        self._segments = dict(loaded.segments)
        self._catalogs = dict(loaded.catalogs)


def row_bytes(key: str, row: RowView) -> int:
    """A row's own bytes: its arrays, 8 per int or float scalar, 1 per bool, its UTF-8 key."""
    size = len(key.encode("utf-8"))
    for value in row.values():
        if isinstance(value, np.ndarray):
            size += value.nbytes
        else:
            size += 1 if isinstance(value, bool) else 8
    return size


def _held(locations: Mapping[str, Mapping[str, _Location]]) -> dict[str, list[int]]:
    """Per segment file, the ordinals of its rows the checkpoint holds."""
    held: dict[str, list[int]] = {}
    for partition_locations in locations.values():
        for location in partition_locations.values():
            held.setdefault(location.segment, []).append(location.ordinal)
    return held


def _catalog_ref(catalog: WrittenCatalog) -> CatalogRef:
    return CatalogRef(
        name=catalog_name_field(catalog.file),
        sha256=bytes.fromhex(catalog.sha256),
        byte_size=catalog.byte_size,
        entry_count=len(catalog.segments),
    )


def _whole_runs(entries: Sequence[HeldEntryV4]) -> list[WholeRun]:
    """Version 5's ``whole``: the numbered segments of ``entries`` holding every row
    (:func:`~rollvault.durable.index_runs.in_a_run`), as maximal runs of numbers, by
    partition then number."""
    numbered = sorted(
        (entry.partition, entry.name)
        for entry in entries
        if in_a_run(entry) and isinstance(entry.name, int)
    )
    return [WholeRun(*run) for run in keyed_runs(numbered)]
