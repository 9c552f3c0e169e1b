"""Incremental data-plane checkpoints: rows stored once in segments, snapshots index them.

A segmented checkpoint directory holds only ``metadata.json``. Its content
lists the partitions (empty ones included) and every segment
(:mod:`rollvault.dataplane.segments`) holding a row of the checkpoint: file
name, partition, SHA-256, byte size, row count, and which of the segment's
rows the checkpoint holds. It never has a per-row entry, so a snapshot's own
bytes stay small next to its new rows.

**Version 5** (written) is version 4 with the numbered segments whose rows it all
holds listed as runs of numbers per partition, ``whole``: ``[partition, first,
count]`` (:class:`WholeRun`, maximal runs, by partition then number), and only the
other segments as version 4's entries (in file-name order). Within an anchor most
held segments hold every row (the train partition's, and the staging partition's
newer ones), so version 4's ~10 bytes for each of those (~1.6 KB a snapshot after
100 snapshots of ``bench_snapshot_cut.py --incremental 100``) become ~10 bytes a run.
It reads into the same :class:`HeldSegment` list in the same order as version 4.

**Version 4** (still read) lists the anchor's catalogs it uses
(:mod:`rollvault.dataplane.segment_catalog`: each segment's partition,
SHA-256, byte size and row count, written once per anchor) as arrays
``[name, sha256, byte_size, entry_count]`` (:class:`CatalogRef`), and each
held segment as ``[name, partition, live]`` (:class:`HeldEntryV4`, ~11 bytes
against version 3's ~80): the index no longer grows by a digest per segment
the anchor's snapshots wrote. The writer keeps at most
:data:`~rollvault.dataplane.segment_catalog.MAX_CATALOGS` listed.

**Version 3** (still read) lists each segment as an array
``[name, partition, sha256, byte_size, row_count, live]``
(:class:`SegmentEntryV3`): ``name`` is the snapshot sequence number the file
name derives from (``segment_file_name(f"{name:06d}", partition)``), or the
file name itself as text when it does not follow that pattern; ``partition``
is an index into ``partitions``; ``sha256`` the raw digest (base64 in JSON);
``live`` the held ordinals either as run lengths, held first and then
alternately dropped and held (``[]`` when every row is held, the common case),
or as the bitmap's raw bytes when that is shorter. About 70 bytes per segment
whose rows are all held. **Version 2** (still read) lists each as an object
(:class:`SegmentReference`): file name, partition name, hex SHA-256, sizes,
``live_rows`` and the base64 bitmap (little-endian bit order), ~250 bytes.
Both read into :class:`HeldSegment`.

:class:`SegmentedWriter` writes successive checkpoints of one store into one
segments directory. It remembers, for the last checkpoint it *committed*
(:meth:`SegmentedWriter.committed`), each key's row token
(:meth:`~rollvault.dataplane.capture.DataPlaneCapture.row_tokens`) and where
the row is; the next checkpoint writes one new segment per partition with
only the rows whose token changed (new keys, or keys cleared and put again),
and references the rest. A checkpoint that fails or is never committed
leaves its segment unreferenced, for :func:`referenced_segments`-driven
garbage collection; the writer's memory still describes the last committed
one, so the next try writes those rows again.

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

import base64
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import (
    CATALOGUED_SCHEMA_VERSIONS,
    DATA_PLANE_SCHEMA_VERSION,
    METADATA_FILENAME,
    SEGMENTED_SCHEMA_VERSIONS,
    SEGMENTED_V2_SCHEMA_VERSION,
    SEGMENTED_V3_SCHEMA_VERSION,
    NonNegativeInt,
    PartitionName,
    Sha256Hex,
    decode_content,
    decode_envelope,
    decode_metadata,
    encode_envelope,
    sha256_hex,
)
from rollvault.dataplane.checkpoint_io import (
    LoadedCheckpoint,
    read_checkpoint,
    read_checkpoint_file,
)
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.segment_catalog import (
    CatalogEntry,
    CatalogFileName,
    SegmentFileName,
    Sha256Bytes,
    WrittenCatalog,
    catalog_file_from_name,
    catalog_file_name,
    catalog_name_field,
    catalogs_to_merge,
    read_catalog,
    require_canonical_name,
    segment_file_from_name,
    segment_name_field,
    write_catalog,
)
from rollvault.dataplane.segments import (
    SegmentRows,
    WrittenSegment,
    check_segment_digest,
    decode_segment,
    read_segment_bytes,
    segment_file_name,
    write_segment,
)
from rollvault.durable.index_runs import (
    RunsFormError,
    expand_number_runs,
    in_a_run,
    in_file_order,
    keyed_runs,
)


class SegmentReference(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One segment a version 2 checkpoint holds rows of, and which of its rows."""

    file: SegmentFileName
    partition: PartitionName
    sha256: Sha256Hex
    byte_size: NonNegativeInt
    row_count: NonNegativeInt
    live_rows: NonNegativeInt
    live: str
    """Base64 of the bitmap of held ordinals (little-endian bit order)."""


class SegmentedCheckpointContent(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a version 2 ``metadata.json`` describes."""

    partitions: list[PartitionName]
    segments: list[SegmentReference]
    user_metadata: dict[str, Any]


class SegmentEntryV3(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One segment of a version 3 checkpoint:
    ``[name, partition, sha256, byte_size, row_count, live]``."""

    name: NonNegativeInt | SegmentFileName
    """The sequence number the file name derives from, or the file name as text."""
    partition: NonNegativeInt
    """Index into ``partitions``."""
    sha256: Sha256Bytes
    byte_size: NonNegativeInt
    row_count: NonNegativeInt
    live: list[NonNegativeInt] | bytes
    """Held ordinals: run lengths (held, dropped, held, ...; ``[]`` = all held) or the
    bitmap's raw bytes (little-endian bit order)."""


_V3_FIELDS = SegmentEntryV3.__struct_fields__
"""The entry's array positions, named in errors."""


class SegmentedCheckpointContentV3(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a version 3 ``metadata.json`` describes."""

    partitions: list[PartitionName]
    segments: list[SegmentEntryV3]
    user_metadata: dict[str, Any]


class CatalogRef(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One catalog a version 4 checkpoint uses: ``[name, sha256, byte_size, entry_count]``."""

    name: NonNegativeInt | CatalogFileName
    """The sequence number the catalog's file name derives from, or the file name as text."""
    sha256: Sha256Bytes
    byte_size: NonNegativeInt
    entry_count: NonNegativeInt


class HeldEntryV4(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One segment a version 4 checkpoint holds rows of: ``[name, partition, live]``, its
    fixed parts in a listed catalog."""

    name: NonNegativeInt | SegmentFileName
    """As version 3's: the sequence number the file name derives from, or the name as text."""
    partition: NonNegativeInt
    """Index into ``partitions``."""
    live: list[NonNegativeInt] | bytes
    """As version 3's: held ordinals as run lengths (``[]`` = all held) or the raw bitmap."""


_V4_FIELDS = HeldEntryV4.__struct_fields__
_CATALOG_FIELDS = CatalogRef.__struct_fields__


class SegmentedCheckpointContentV4(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a version 4 ``metadata.json`` describes."""

    partitions: list[PartitionName]
    catalogs: list[CatalogRef]
    segments: list[HeldEntryV4]
    user_metadata: dict[str, Any]


class WholeRun(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """Numbered segments of one partition a version 5 checkpoint holds every row of:
    ``[partition, first, count]``, the segments numbered ``first`` to ``first + count - 1``."""

    partition: NonNegativeInt
    """Index into ``partitions``."""
    first: NonNegativeInt
    count: NonNegativeInt
    """At least 1 (checked with the runs' order, naming the run)."""


class SegmentedCheckpointContentV5(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a version 5 ``metadata.json`` describes: version 4's, the numbered segments all
    of whose rows it holds as ``whole`` runs (by partition, then number; maximal), the
    others in ``segments`` (in the order of their file names, as version 4 lists them)."""

    partitions: list[PartitionName]
    catalogs: list[CatalogRef]
    whole: list[WholeRun]
    segments: list[HeldEntryV4]
    user_metadata: dict[str, Any]


@dataclass(frozen=True)
class HeldSegment:
    """One segment a checkpoint holds rows of, whichever version listed it."""

    file: str
    partition: str
    sha256: str
    """Hex SHA-256 of the file."""
    byte_size: int
    row_count: int
    live_rows: int
    wanted: list[bool]
    """One bool per ordinal: whether the checkpoint holds that row."""


@dataclass(frozen=True)
class SegmentedIndex:
    """A checked segmented ``metadata.json`` (version 2 or 3)."""

    schema_version: int
    partitions: list[str]
    segments: list[HeldSegment]
    user_metadata: dict[str, Any]
    catalogs: tuple[WrittenCatalog, ...] = ()
    """Version 4: the catalogs it lists, in its order (none before)."""


@dataclass(frozen=True)
class CheckpointSummary:
    """What ``metadata.json`` alone says: rows per partition, files and sizes, user metadata."""

    schema_version: int
    row_counts: dict[str, int]
    files: tuple[tuple[Path, int], ...]
    """Every file the checkpoint's rows are in, with its recorded size."""
    user_metadata: dict[str, Any]


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
        catalog_of = {
            segment: catalog.file
            for catalog in self._catalogs.values()
            for segment in catalog.segments
        }
        live: dict[str, int] = dict.fromkeys(self._catalogs, 0)
        fresh = []
        for file in held:
            if file in catalog_of:
                live[catalog_of[file]] += 1
            else:
                fresh.append(file)
        merged = set(catalogs_to_merge(live, adding=bool(fresh)))
        fresh += [file for file in held if catalog_of.get(file) in merged]
        catalogs = {
            file: self._catalogs[file]
            for file, count in live.items()
            if count and file not in merged
        }
        if not fresh:
            return catalogs, 0
        written = write_catalog(
            self.segments_dir, catalog_file_name(stem), [known[file] for file in sorted(fresh)]
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


def _held_entries_v5(
    content: SegmentedCheckpointContentV5, path: Path
) -> list[tuple[str, HeldEntryV4]]:
    """Version 5's held segments as version 4 lists them (in its order: by file name), each
    with where it is listed. Refused naming the field: a run of a partition not listed, out
    of order, empty or touching the one before (one spelling per set of segments); an
    entry of ``segments`` that belongs in a run (numbered, every row held), is out of order
    or is in a run too (:func:`~rollvault.durable.index_runs.in_file_order`)."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    positions: dict[int, list[int]] = {}
    for position, run in enumerate(content.whole):
        if run.partition >= len(content.partitions) or run.partition < max(by_partition, default=0):
            problem = (
                "is not an index of $.content.partitions"
                if run.partition >= len(content.partitions)
                else "comes after a later partition's runs"
            )
            raise DataPlaneCheckpointError(
                path, f"$.content.whole[{position}][0] (partition): {run.partition} {problem}"
            )
        by_partition.setdefault(run.partition, []).append((run.first, run.count))
        positions.setdefault(run.partition, []).append(position)
    whole: list[tuple[str, tuple[str, HeldEntryV4]]] = []
    for partition, runs in by_partition.items():
        try:
            numbers = expand_number_runs(runs)
        except RunsFormError as exc:
            # The place it names is among this partition's runs.
            raise DataPlaneCheckpointError(
                path, f"$.content.whole[{positions[partition][exc.position]}]: {exc}"
            ) from exc
        label = f"$.content.whole[{positions[partition][0]}..]"
        for number in numbers:
            file = segment_file_from_name(number, content.partitions[partition])
            entry = HeldEntryV4(number, partition, [])
            whole.append((file, (f"{label} (segment {number})", entry)))
    others: list[tuple[str, HeldEntryV4, tuple[str, HeldEntryV4]]] = []
    for position, entry in enumerate(content.segments):
        label = f"$.content.segments[{position}]"

        def where(field: str, label: str = label) -> str:
            return f"{label}[{_V4_FIELDS.index(field)}] ({field})"

        name = _partition_at(content.partitions, entry.partition, where, path)
        file = segment_file_from_name(entry.name, name)
        others.append((file, entry, (label, entry)))
    try:
        return in_file_order(whole, others)
    except ValueError as exc:
        raise DataPlaneCheckpointError(path, f"$.content.segments{exc}") from exc


def encode_live(count: int, held: Sequence[int]) -> list[int] | bytes:
    """Version 3's ``live`` of ``count`` ordinals with ``held`` set: ``[]`` when all are,
    else run lengths (held first) or the raw bitmap, whichever encodes shorter in JSON."""
    if len(set(held)) == count:
        return []
    bits = np.zeros(count, dtype=bool)
    bits[list(held)] = True
    changes = (np.flatnonzero(bits[1:] != bits[:-1]) + 1).tolist()
    boundaries = [0, *changes, count]
    runs = [] if bits[0] else [0]
    runs += [end - begin for begin, end in zip(boundaries, boundaries[1:], strict=False)]
    bitmap = np.packbits(bits, bitorder="little").tobytes()
    if len(msgspec.json.encode(runs)) <= len(msgspec.json.encode(bitmap)):
        return runs
    return bitmap


def decode_live(live: list[int] | bytes, count: int) -> list[bool]:
    """The held ordinals version 3's ``live`` records, one bool per ordinal.

    Raises ``ValueError`` saying what is wrong: runs that do not add up to
    ``count``, a zero-length run other than the first, all rows held written as
    runs rather than ``[]``; a bitmap of the wrong length or with bits set beyond
    ``count``.
    """
    if isinstance(live, bytes):
        if len(live) != -(-count // 8):
            raise ValueError(f"{len(live)} bytes for {count} rows (expected {-(-count // 8)})")
        bits = np.unpackbits(np.frombuffer(live, dtype=np.uint8), bitorder="little")
        if bits[count:].any():
            raise ValueError(f"bits set beyond row {count}")
        wanted: list[bool] = bits[:count].astype(bool).tolist()
        return wanted
    if not live:
        return [True] * count
    if 0 in live[1:]:
        raise ValueError(f"run {live.index(0, 1)} is empty (only the first run may be)")
    if sum(live) != count:
        raise ValueError(f"runs add up to {sum(live)} rows, the segment has {count}")
    if len(live) == 1:
        raise ValueError("one run holds every row (written as [])")
    wanted = []
    for position, length in enumerate(live):
        wanted += [position % 2 == 0] * length
    return wanted


def encode_live_bitmap(count: int, held: Sequence[int]) -> str:
    """Base64 of the bitmap over ``count`` ordinals with ``held`` set (little-endian bit order).

    The form every segment index uses for the entries of a segment a snapshot
    still holds (rows here; the controller's per-group facts too).
    """
    bits = np.zeros(count, dtype=bool)
    bits[list(held)] = True
    return base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode()


def decode_live_bitmap(
    encoded: str, count: int, live: int, *, noun: str = "row", live_field: str = "live_rows"
) -> list[bool]:
    """The bitmap :func:`encode_live_bitmap` wrote, one bool per ordinal.

    Raises ``ValueError`` saying what is wrong: not base64, the wrong length
    for ``count`` ordinals, bits set beyond them, or not ``live`` bits set
    (``noun`` names an entry and ``live_field`` the count in the messages).
    """
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError as exc:
        raise ValueError(f"not base64: {exc}") from exc
    if len(raw) != -(-count // 8):
        raise ValueError(f"{len(raw)} bytes for {count} {noun}s (expected {-(-count // 8)})")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if bits[count:].any():
        raise ValueError(f"bits set beyond {noun} {count}")
    wanted = bits[:count].astype(bool)
    if int(wanted.sum()) != live:
        raise ValueError(f"{int(wanted.sum())} {noun}s set, {live_field} records {live}")
    return wanted.tolist()


# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedSegmented:
    """A verified segmented checkpoint: its rows, and where each is (to seed a writer)."""

    checkpoint: LoadedCheckpoint
    segments: dict[str, WrittenSegment]
    """The segments it holds rows of, in the index's order."""
    wanted: dict[str, list[bool]] | None = None
    """Per segment file, whether the checkpoint holds each of its rows (by ordinal);
    None for a version 1 checkpoint, which has no segments."""
    catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
    """Version 4: the catalogs it lists (a writer seeded from it goes on with them)."""

    @functools.cached_property
    def locations(self) -> dict[str, dict[str, tuple[str, int]]]:
        """Per partition, each held row's segment file and ordinal in it.

        Built when first asked (a writer seeded for the first snapshot after a
        restore), not by every restore: ~1 ms of 9.5k rows at 1,024 x 16.
        """
        if self.wanted is None:
            return {}
        locations: dict[str, dict[str, tuple[str, int]]] = {
            name: {} for name in self.checkpoint.partitions
        }
        for file, segment in self.segments.items():
            locations[segment.partition].update(_held_at(file, segment.keys, self.wanted[file]))
        return locations


def _held_at(
    file: str, keys: Sequence[str], wanted: Sequence[bool]
) -> Iterator[tuple[str, tuple[str, int]]]:
    """``(key, (file, ordinal))`` of each row of a segment that ``wanted`` holds."""
    for ordinal, (key, kept) in enumerate(zip(keys, wanted, strict=True)):
        if kept:
            yield key, (file, ordinal)


def read_segmented_content(directory: Path, segments_dir: Path | None = None) -> SegmentedIndex:
    """Read and check a segmented ``metadata.json`` of version 2, 3 or 4 (no segment is read;
    version 4's catalogs are, from ``segments_dir``, which it needs).

    Every problem raises :class:`DataPlaneCheckpointError` naming the file and
    the field; any other version is refused naming the file.
    """
    path = directory / METADATA_FILENAME
    version, content_bytes = decode_envelope(read_checkpoint_file(path), path)
    return _segmented_index(version, content_bytes, path, segments_dir)


def _segmented_index(
    version: int, content_bytes: bytes, path: Path, segments_dir: Path | None
) -> SegmentedIndex:
    """:func:`read_segmented_content` of an envelope already read and decoded."""
    if version in CATALOGUED_SCHEMA_VERSIONS:
        if segments_dir is None:
            raise DataPlaneCheckpointError(
                path,
                f"schema_version {version} lists catalogs: read it with its segments directory",
            )
        return _index_v4(_catalogued_content(version, content_bytes, path), path, segments_dir)
    if version == SEGMENTED_V3_SCHEMA_VERSION:
        content = decode_content(content_bytes, SegmentedCheckpointContentV3, path)
        return _index_v3(content, path)
    if version == SEGMENTED_V2_SCHEMA_VERSION:
        old = decode_content(content_bytes, SegmentedCheckpointContent, path)
        return _index_v2(old, path)
    raise DataPlaneCheckpointError(path, f"schema_version {version} is not a segmented checkpoint")


def live_bitmap(reference: SegmentReference, path: Path, where: str) -> list[bool]:
    """The held ordinals of a version 2 ``reference``, one bool per row; a malformed bitmap
    raises."""
    try:
        return decode_live_bitmap(reference.live, reference.row_count, reference.live_rows)
    except ValueError as exc:
        raise DataPlaneCheckpointError(path, f"{where}.live: {exc}") from exc


def _check_partitions(partitions: list[str], path: Path) -> None:
    if len(set(partitions)) != len(partitions):
        raise DataPlaneCheckpointError(path, f"$.content.partitions: duplicates in {partitions}")


def _index_v2(content: SegmentedCheckpointContent, path: Path) -> SegmentedIndex:
    _check_partitions(content.partitions, path)
    seen: set[str] = set()
    segments = []
    for index, reference in enumerate(content.segments):
        where = f"$.content.segments[{index}]"
        if reference.file in seen:
            raise DataPlaneCheckpointError(path, f"{where}.file: {reference.file!r} listed twice")
        seen.add(reference.file)
        if reference.partition not in content.partitions:
            raise DataPlaneCheckpointError(
                path, f"{where}.partition: {reference.partition!r} is not in $.content.partitions"
            )
        segments.append(
            HeldSegment(
                file=reference.file,
                partition=reference.partition,
                sha256=reference.sha256,
                byte_size=reference.byte_size,
                row_count=reference.row_count,
                live_rows=reference.live_rows,
                wanted=live_bitmap(reference, path, where),
            )
        )
    return SegmentedIndex(
        SEGMENTED_V2_SCHEMA_VERSION, content.partitions, segments, content.user_metadata
    )


def _index_v3(content: SegmentedCheckpointContentV3, path: Path) -> SegmentedIndex:
    _check_partitions(content.partitions, path)
    seen: dict[str, int] = {}
    segments = []
    for index, entry in enumerate(content.segments):

        def where(field: str, index: int = index) -> str:
            return f"$.content.segments[{index}][{_V3_FIELDS.index(field)}] ({field})"

        partition = _partition_at(content.partitions, entry.partition, where, path)
        file = segment_file_from_name(entry.name, partition)
        first = seen.setdefault(file, index)
        if first != index:
            raise DataPlaneCheckpointError(
                path, f"{where('name')}: {file!r} listed twice (first at segments[{first}])"
            )
        segments.append(_held_segment(file, partition, entry, entry.live, where, path))
    return SegmentedIndex(
        SEGMENTED_V3_SCHEMA_VERSION, content.partitions, segments, content.user_metadata
    )


def _partition_at(
    partitions: Sequence[str], position: int, where: Callable[[str], str], path: Path
) -> str:
    """The partition a compact row's ``position`` names (versions 3 and 4); ``where``
    names a field of the row, in an error only (built per row, it would cost every read)."""
    if position >= len(partitions):
        raise DataPlaneCheckpointError(
            path,
            f"{where('partition')}: {position} is not an index of $.content.partitions "
            f"({len(partitions)} of them)",
        )
    return partitions[position]


def _held_segment(
    file: str,
    partition: str,
    fixed: SegmentEntryV3 | CatalogEntry,
    live: list[int] | bytes,
    where: Callable[[str], str],
    path: Path,
) -> HeldSegment:
    """A held segment of version 3 or 4: its fixed parts (a version 3 row, a catalog's
    entry) and the ordinals ``live`` holds (``where`` names the row's fields)."""
    try:
        wanted = decode_live(live, fixed.row_count)
    except ValueError as exc:
        raise DataPlaneCheckpointError(path, f"{where('live')}: {exc}") from exc
    return HeldSegment(
        file=file,
        partition=partition,
        sha256=fixed.sha256.hex(),
        byte_size=fixed.byte_size,
        row_count=fixed.row_count,
        live_rows=wanted.count(True),
        wanted=wanted,
    )


_Catalogued = tuple[int, SegmentedCheckpointContentV4 | SegmentedCheckpointContentV5]


def _catalogued_content(version: int, content_bytes: bytes, path: Path) -> _Catalogued:
    """A version 4 or 5 content, decoded against its version's schema."""
    if version == DATA_PLANE_SCHEMA_VERSION:
        return version, decode_content(content_bytes, SegmentedCheckpointContentV5, path)
    return version, decode_content(content_bytes, SegmentedCheckpointContentV4, path)


def _held_entries(content: _Catalogued, path: Path) -> list[tuple[str, HeldEntryV4]]:
    """The held segments of a version 4 or 5 content, each with where it is listed."""
    _version, listed = content
    if isinstance(listed, SegmentedCheckpointContentV5):
        return _held_entries_v5(listed, path)
    return [(f"$.content.segments[{index}]", held) for index, held in enumerate(listed.segments)]


def _index_v4(content: _Catalogued, path: Path, segments_dir: Path) -> SegmentedIndex:
    """Version 4's (and 5's) index: each listed catalog read and checked, each held segment's
    fixed parts from the one catalog describing it (matched on ``(name, partition)``, both
    canonical: no file name is built twice)."""
    version, listed = content
    _check_partitions(listed.partitions, path)
    catalogs, described = _read_catalogs(listed.catalogs, path, segments_dir)
    seen: dict[tuple[int | str, str], str] = {}
    segments = []
    for label, held in _held_entries(content, path):

        def where(field: str, label: str = label) -> str:
            return f"{label}[{_V4_FIELDS.index(field)}] ({field})"

        partition = _partition_at(listed.partitions, held.partition, where, path)
        try:
            require_canonical_name(held.name, partition)
        except ValueError as exc:
            raise DataPlaneCheckpointError(path, f"{label}{exc}") from exc
        key = (held.name, partition)
        first = seen.setdefault(key, label)
        found = described.get(key)
        if first != label or found is None:
            file = segment_file_from_name(held.name, partition)
            problem = (
                f"{file!r} listed twice (first at {first})"
                if first != label
                else f"segment {file!r} is described by none of its catalogs"
            )
            raise DataPlaneCheckpointError(path, f"{where('name')}: {problem}")
        entry, file = found
        segments.append(_held_segment(file, partition, entry, held.live, where, path))
    return SegmentedIndex(
        version,
        listed.partitions,
        segments,
        listed.user_metadata,
        catalogs=tuple(catalogs),
    )


_Described = dict[tuple[int | str, str], tuple[CatalogEntry, str]]
"""Per segment ``(name, partition)``, its catalog entry and its file name."""


def _read_catalogs(
    refs: Sequence[CatalogRef], path: Path, segments_dir: Path
) -> tuple[list[WrittenCatalog], _Described]:
    """The catalogs ``refs`` list, each read and checked against its row, and each segment's
    entry; a catalog listed twice or a segment described by two raise."""
    catalogs: list[WrittenCatalog] = []
    described: _Described = {}
    owner: dict[tuple[int | str, str], str] = {}
    for index, ref in enumerate(refs):
        file = catalog_file_from_name(ref.name)
        if any(catalog.file == file for catalog in catalogs):
            raise DataPlaneCheckpointError(
                path,
                f"$.content.catalogs[{index}][{_CATALOG_FIELDS.index('name')}] (name): "
                f"{file!r} listed twice",
            )
        catalog_path = segments_dir / file
        catalog = read_catalog(
            catalog_path,
            sha256=ref.sha256.hex(),
            byte_size=ref.byte_size,
            entry_count=ref.entry_count,
        )
        files = []
        for entry in catalog.entries:
            key = (entry.name, entry.partition)
            segment = segment_file_from_name(entry.name, entry.partition)
            other = owner.setdefault(key, file)
            if other != file:
                raise DataPlaneCheckpointError(
                    catalog_path, f"segment {segment!r} is also described by catalog {other!r}"
                )
            described[key] = (entry, segment)
            files.append(segment)
        catalogs.append(
            WrittenCatalog(
                file=file,
                sha256=ref.sha256.hex(),
                byte_size=ref.byte_size,
                segments=tuple(files),
            )
        )
    return catalogs, described


def read_segmented(directory: Path, segments_dir: Path) -> LoadedSegmented:
    """Read and verify a segmented (version 2 or 3) checkpoint and every segment it references.

    Raises :class:`DataPlaneCheckpointError` naming the file: ``metadata.json``
    or the segment that is missing, damaged or disagrees with the index.
    """
    if not directory.is_dir():
        raise DataPlaneCheckpointError(directory, "not a checkpoint directory (absent or a file)")
    index = read_segmented_content(directory, segments_dir)
    return _open_segmented(directory, segments_dir, index).finish()


def read_any_checkpoint(directory: Path, segments_dir: Path) -> LoadedSegmented:
    """Read a checkpoint of any version: version 1 has no segments (nothing to seed)."""
    return open_any_checkpoint(directory, segments_dir).finish()


class OpenedCheckpoint:
    """A checkpoint whose ``metadata.json`` is read and checked, its rows still being read.

    :func:`open_any_checkpoint` returns it once the index is checked and every
    segment's bytes are read (on the caller's thread: from the page cache that
    is well under a millisecond for a restore's ~16 MB), with their SHA-256s
    computed by a worker thread meanwhile. hashlib releases the GIL while it
    hashes, so the caller can do its own work (a restore builds the ledger's
    records, pure Python) on one core while the other hashes. :meth:`finish`
    waits for the digests and decodes the rows, each segment only after its
    digest matched, in the index's order: the first problem it raises is the
    one reading everything in that order on one thread would have raised.
    """

    def __init__(
        self, user_metadata: dict[str, Any], finish: Callable[[], LoadedSegmented]
    ) -> None:
        self.user_metadata = user_metadata
        """The checkpoint's ``user_metadata``, checked with ``metadata.json``."""
        self._finish = finish

    def finish(self) -> LoadedSegmented:
        """The verified checkpoint; the first problem of a segment raises
        :class:`DataPlaneCheckpointError` naming it. Call it once."""
        return self._finish()


def open_any_checkpoint(directory: Path, segments_dir: Path) -> OpenedCheckpoint:
    """Start reading a checkpoint of any version; :meth:`OpenedCheckpoint.finish` ends it.

    ``metadata.json`` is read once. Its problems, and for a segmented
    checkpoint a file it does not list or the first segment that cannot be
    read, raise :class:`DataPlaneCheckpointError` in the order a reading on one
    thread meets them; a version 1 checkpoint is read whole here (it has no
    segments).
    """
    path = directory / METADATA_FILENAME
    data = read_checkpoint_file(path)
    version, content_bytes = decode_envelope(data, path)
    if version not in SEGMENTED_SCHEMA_VERSIONS:
        checkpoint = read_checkpoint(directory, metadata=data)
        loaded = LoadedSegmented(checkpoint=checkpoint, segments={})
        return OpenedCheckpoint(checkpoint.user_metadata, lambda: loaded)
    index = _segmented_index(version, content_bytes, path, segments_dir)
    return _open_segmented(directory, segments_dir, index)


def _open_segmented(directory: Path, segments_dir: Path, index: SegmentedIndex) -> OpenedCheckpoint:
    extra = sorted(entry.name for entry in directory.iterdir() if entry.name != METADATA_FILENAME)
    if extra:
        raise DataPlaneCheckpointError(
            directory / extra[0], f"unexpected file (not listed in {METADATA_FILENAME})"
        )
    # Read in the index's order up to the first segment that cannot be read: finish()
    # raises its error once every segment before it is verified and decoded.
    reads: list[bytes | DataPlaneCheckpointError] = []
    for reference in index.segments:
        try:
            reads.append(
                read_segment_bytes(segments_dir / reference.file, byte_size=reference.byte_size)
            )
        except DataPlaneCheckpointError as exc:
            reads.append(exc)
            break
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollvault-segment-sha256")
    digests = pool.submit(_digests, [data for data in reads if isinstance(data, bytes)])
    pool.shutdown(wait=False)  # its thread ends with the hashing; finish() waits for it
    return OpenedCheckpoint(
        index.user_metadata,
        functools.partial(_finish_segmented, segments_dir, index, reads, digests),
    )


def _digests(datas: list[bytes]) -> list[str]:
    """Each buffer's hex SHA-256 (in a worker thread: hashlib releases the GIL meanwhile)."""
    return list(map(sha256_hex, datas))


def _finish_segmented(
    segments_dir: Path,
    index: SegmentedIndex,
    reads: list[bytes | DataPlaneCheckpointError],
    digests: Future[list[str]],
) -> LoadedSegmented:
    partitions: dict[str, dict[str, RowView]] = {name: {} for name in index.partitions}
    segments: dict[str, WrittenSegment] = {}
    computed = iter(digests.result())
    # reads is index.segments' prefix up to the first unreadable segment, if any.
    for position, (reference, data) in enumerate(zip(index.segments, reads, strict=False)):
        if isinstance(data, DataPlaneCheckpointError):
            raise data
        # The decoded rows are views of these bytes: from here on they alone keep them.
        reads[position] = b""
        segment_path = segments_dir / reference.file
        check_segment_digest(segment_path, next(computed), reference.sha256)
        loaded = decode_segment(
            segment_path,
            data,
            partition=reference.partition,
            row_count=reference.row_count,
            wanted=reference.wanted,
        )
        del data
        _add_rows(segment_path, reference, loaded, partitions, index.segments, segments)
        segments[reference.file] = WrittenSegment(
            file=reference.file,
            partition=reference.partition,
            sha256=reference.sha256,
            byte_size=reference.byte_size,
            keys=loaded.keys,
        )
    return LoadedSegmented(
        checkpoint=LoadedCheckpoint(partitions=partitions, user_metadata=index.user_metadata),
        segments=segments,
        wanted={reference.file: reference.wanted for reference in index.segments},
        catalogs={catalog.file: catalog for catalog in index.catalogs},
    )


def _add_rows(
    segment_path: Path,
    reference: HeldSegment,
    loaded: SegmentRows,
    partitions: dict[str, dict[str, RowView]],
    references: Sequence[HeldSegment],
    segments: Mapping[str, WrittenSegment],
) -> None:
    """Add one segment's held rows; a key a segment added before (in ``segments``) holds
    raises."""
    rows = partitions[reference.partition]
    # loaded.rows holds exactly the wanted rows, each key once: a set
    # intersection in C finds a key another segment holds too.
    twice = rows.keys() & loaded.rows.keys()
    if twice:
        key = min(twice)
        raise DataPlaneCheckpointError(
            segment_path,
            f"key {key!r} of partition {reference.partition!r} is also held from "
            f"segment {_holder(key, reference.partition, references, segments)!r}",
        )
    rows.update(loaded.rows)


def _holder(
    key: str,
    partition: str,
    references: Sequence[HeldSegment],
    segments: Mapping[str, WrittenSegment],
) -> str:
    """The file of the segment among ``references`` already added (in ``segments``) whose
    held rows include ``key`` of ``partition``: searched only for the message, as a restore
    builds no row locations (:attr:`LoadedSegmented.locations`)."""
    for reference in references:
        if reference.partition != partition or reference.file not in segments:
            continue
        held = compress(segments[reference.file].keys, reference.wanted)
        if key in held:
            return reference.file
    raise AssertionError(f"no earlier segment holds {key!r}")  # pragma: no cover - checked


def checkpoint_summary(directory: Path, segments_dir: Path) -> CheckpointSummary:
    """Read only ``metadata.json`` (any version): row counts, files and sizes, user metadata."""
    path = directory / METADATA_FILENAME
    data = read_checkpoint_file(path)
    version, content_bytes = decode_envelope(data, path)
    if version in SEGMENTED_SCHEMA_VERSIONS:
        content = _segmented_index(version, content_bytes, path, segments_dir)
        counts = dict.fromkeys(content.partitions, 0)
        for reference in content.segments:
            counts[reference.partition] += reference.live_rows
        files = tuple((segments_dir / r.file, r.byte_size) for r in content.segments)
        files += tuple((segments_dir / c.file, c.byte_size) for c in content.catalogs)
        return CheckpointSummary(version, counts, files, content.user_metadata)
    old = decode_metadata(data, path)
    return CheckpointSummary(
        version,
        {partition.name: len(partition.rows) for partition in old.partitions},
        tuple((directory / partition.file, partition.byte_size) for partition in old.partitions),
        old.user_metadata,
    )


def referenced_segments(checkpoint_dirs: Sequence[Path]) -> set[str]:
    """Segment files any of ``checkpoint_dirs`` references (version 1 ones reference none).

    Raises :class:`DataPlaneCheckpointError` if one cannot be read: then what
    it references is unknown, and garbage collection must not guess.
    """
    files: set[str] = set()
    for directory in checkpoint_dirs:
        path = directory / METADATA_FILENAME
        version, content_bytes = decode_envelope(read_checkpoint_file(path), path)
        if version in CATALOGUED_SCHEMA_VERSIONS:
            files |= _files_of_v4(_catalogued_content(version, content_bytes, path), path)
        elif version in SEGMENTED_SCHEMA_VERSIONS:
            index = _segmented_index(version, content_bytes, path, None)
            files |= {reference.file for reference in index.segments}
    return files


def _files_of_v4(content: _Catalogued, path: Path) -> set[str]:
    """The segment and catalog files a version 4 or 5 index names (no catalog read:
    retention needs the names only). An index naming a partition it does not list, or (5)
    whose runs or other entries are out of their form, raises."""
    _version, listed = content
    files = {catalog_file_from_name(ref.name) for ref in listed.catalogs}
    for label, held in _held_entries(content, path):
        if held.partition >= len(listed.partitions):
            raise DataPlaneCheckpointError(
                path,
                f"{label}: partition {held.partition} is not an index of $.content.partitions",
            )
        files.add(segment_file_from_name(held.name, listed.partitions[held.partition]))
    return files
