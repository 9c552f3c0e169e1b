"""Incremental data-plane checkpoints: rows stored once in segments, snapshots index them.

A version 2 checkpoint directory holds only ``metadata.json``. Its content
lists the partitions (empty ones included) and every segment
(:mod:`rollvault.dataplane.segments`) holding a row of the checkpoint: file
name, partition, SHA-256, byte size, row count, and which of the segment's
rows the checkpoint holds, as a bitmap over the segment's ordinals (base64,
little-endian bit order) with its population count. The index costs a bit
per row of the segments it references plus ~250 bytes per segment, never a
per-row entry, so a snapshot's own bytes stay small next to its new rows.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import (
    DATA_PLANE_SCHEMA_VERSION,
    METADATA_FILENAME,
    NonNegativeInt,
    PartitionName,
    Sha256Hex,
    decode_content,
    decode_envelope,
    decode_metadata,
    encode_envelope,
)
from rollvault.dataplane.checkpoint_io import (
    LoadedCheckpoint,
    read_checkpoint,
    read_checkpoint_file,
)
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.segments import (
    WrittenSegment,
    read_segment,
    segment_file_name,
    write_segment,
)

SegmentFileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.segment\.safetensors$"),
]


class SegmentReference(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One segment a checkpoint holds rows of, and which of its rows."""

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
    """``metadata.json`` plus the new segments."""
    segment_bytes: int
    new_rows: int
    new_row_bytes: int
    """The new rows' own bytes: arrays, 8 per int or float scalar, 1 per bool, UTF-8 keys."""
    row_counts: dict[str, int]
    referenced: tuple[str, ...]
    """Segment files the checkpoint references."""


@dataclass(frozen=True)
class _Location:
    token: object
    segment: str
    ordinal: int


@dataclass
class PendingCheckpoint:
    """A written checkpoint the writer adopts as its base once it is committed."""

    locations: dict[str, dict[str, _Location]]
    segments: dict[str, WrittenSegment]
    info: SegmentedWriteInfo


@dataclass
class SegmentedWriter:
    """Writes incremental checkpoints of one store into ``segments_dir`` (one writer per dir)."""

    segments_dir: Path
    last_written: PendingCheckpoint | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _locations: dict[str, dict[str, _Location]] = field(default_factory=dict)
    _segments: dict[str, WrittenSegment] = field(default_factory=dict)

    def write(
        self,
        directory: Path,
        capture: DataPlaneCapture,
        user_metadata: dict[str, Any],
        *,
        stem: str,
    ) -> PendingCheckpoint:
        """Write new rows as segments named after ``stem``, then ``directory/metadata.json``.

        ``user_metadata`` must already be checked JSON. Segments are durable
        when this returns; ``metadata.json`` is not flushed (the snapshot's
        commit does it). Call :meth:`committed` once the checkpoint is committed.
        """
        directory.mkdir(exist_ok=True)
        leftovers = sorted(entry.name for entry in directory.iterdir())
        if leftovers:
            raise DataPlaneCheckpointError(
                directory, f"checkpoint directory is not empty (holds {leftovers})"
            )
        locations: dict[str, dict[str, _Location]] = {}
        segments: dict[str, WrittenSegment] = {}
        new_rows = new_row_bytes = segment_bytes = 0
        for partition in capture.partitions():
            previous = self._locations.get(partition, {})
            tokens = capture.row_tokens(partition)
            kept = {
                key: previous[key]
                for key, token in tokens.items()
                if key in previous and previous[key].token is token
            }
            fresh = [key for key in tokens if key not in kept]
            if fresh:
                rows = capture.select(partition, fresh)
                file = segment_file_name(stem, partition)
                written = write_segment(self.segments_dir, file, partition, rows)
                segments[file] = written
                segment_bytes += written.byte_size
                new_rows += len(rows)
                new_row_bytes += sum(row_bytes(key, row) for key, row in rows.items())
                for ordinal, key in enumerate(written.keys):
                    kept[key] = _Location(tokens[key], file, ordinal)
            locations[partition] = kept
        known = {**self._segments, **segments}
        references = _references(locations, known)
        content = SegmentedCheckpointContent(
            partitions=capture.partitions(), segments=references, user_metadata=user_metadata
        )
        metadata = encode_envelope(msgspec.json.encode(content), DATA_PLANE_SCHEMA_VERSION)
        with open(directory / METADATA_FILENAME, "xb") as handle:
            handle.write(metadata)
        info = SegmentedWriteInfo(
            bytes_written=len(metadata) + segment_bytes,
            segment_bytes=segment_bytes,
            new_rows=new_rows,
            new_row_bytes=new_row_bytes,
            row_counts=capture.row_counts(),
            referenced=tuple(reference.file for reference in references),
        )
        used = {reference.file: known[reference.file] for reference in references}
        self.last_written = PendingCheckpoint(locations=locations, segments=used, info=info)
        return self.last_written

    def committed(self, pending: PendingCheckpoint) -> None:
        """Make ``pending`` the base of the next checkpoint: it is committed now."""
        self._locations = pending.locations
        self._segments = pending.segments
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Segment files the last committed checkpoint references."""
        return set(self._segments)

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


def row_bytes(key: str, row: RowView) -> int:
    """A row's own bytes: its arrays, 8 per int or float scalar, 1 per bool, its UTF-8 key."""
    size = len(key.encode("utf-8"))
    for value in row.values():
        if isinstance(value, np.ndarray):
            size += value.nbytes
        else:
            size += 1 if isinstance(value, bool) else 8
    return size


def _references(
    locations: Mapping[str, Mapping[str, _Location]], segments: Mapping[str, WrittenSegment]
) -> list[SegmentReference]:
    held: dict[str, list[int]] = {}
    for partition_locations in locations.values():
        for location in partition_locations.values():
            held.setdefault(location.segment, []).append(location.ordinal)
    references = []
    for file in sorted(held):
        segment = segments[file]
        references.append(
            SegmentReference(
                file=file,
                partition=segment.partition,
                sha256=segment.sha256,
                byte_size=segment.byte_size,
                row_count=segment.row_count,
                live_rows=len(held[file]),
                live=encode_live_bitmap(segment.row_count, held[file]),
            )
        )
    return references


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
    """A verified version 2 checkpoint: its rows, and where each is (to seed a writer)."""

    checkpoint: LoadedCheckpoint
    locations: dict[str, dict[str, tuple[str, int]]]
    segments: dict[str, WrittenSegment]


def read_segmented_content(directory: Path) -> SegmentedCheckpointContent:
    """Read and check a version 2 ``metadata.json`` (no segment is read)."""
    path = directory / METADATA_FILENAME
    data = read_checkpoint_file(path)
    version, content_bytes = decode_envelope(data, path)
    if version != DATA_PLANE_SCHEMA_VERSION:
        raise DataPlaneCheckpointError(
            path, f"schema_version {version} is not a segmented checkpoint"
        )
    content = decode_content(content_bytes, SegmentedCheckpointContent, path)
    _check_segmented_content(content, path)
    return content


def live_bitmap(reference: SegmentReference, path: Path, where: str) -> list[bool]:
    """The held ordinals of ``reference`` as one bool per row; a malformed bitmap raises."""
    try:
        return decode_live_bitmap(reference.live, reference.row_count, reference.live_rows)
    except ValueError as exc:
        raise DataPlaneCheckpointError(path, f"{where}.live: {exc}") from exc


def _check_segmented_content(content: SegmentedCheckpointContent, path: Path) -> None:
    if len(set(content.partitions)) != len(content.partitions):
        raise DataPlaneCheckpointError(
            path, f"$.content.partitions: duplicates in {content.partitions}"
        )
    seen: set[str] = set()
    for index, reference in enumerate(content.segments):
        where = f"$.content.segments[{index}]"
        if reference.file in seen:
            raise DataPlaneCheckpointError(path, f"{where}.file: {reference.file!r} listed twice")
        seen.add(reference.file)
        if reference.partition not in content.partitions:
            raise DataPlaneCheckpointError(
                path, f"{where}.partition: {reference.partition!r} is not in $.content.partitions"
            )
        live_bitmap(reference, path, where)


def read_segmented(directory: Path, segments_dir: Path) -> LoadedSegmented:
    """Read and verify a version 2 checkpoint and every segment it references.

    Raises :class:`DataPlaneCheckpointError` naming the file: ``metadata.json``
    or the segment that is missing, damaged or disagrees with the index.
    """
    if not directory.is_dir():
        raise DataPlaneCheckpointError(directory, "not a checkpoint directory (absent or a file)")
    content = read_segmented_content(directory)
    extra = sorted(entry.name for entry in directory.iterdir() if entry.name != METADATA_FILENAME)
    if extra:
        raise DataPlaneCheckpointError(
            directory / extra[0], f"unexpected file (not listed in {METADATA_FILENAME})"
        )
    partitions: dict[str, dict[str, RowView]] = {name: {} for name in content.partitions}
    locations: dict[str, dict[str, tuple[str, int]]] = {name: {} for name in content.partitions}
    segments: dict[str, WrittenSegment] = {}
    metadata_path = directory / METADATA_FILENAME
    for index, reference in enumerate(content.segments):
        wanted = live_bitmap(reference, metadata_path, f"$.content.segments[{index}]")
        segment_path = segments_dir / reference.file
        loaded = read_segment(
            segment_path,
            partition=reference.partition,
            sha256=reference.sha256,
            byte_size=reference.byte_size,
            row_count=reference.row_count,
            wanted=wanted,
        )
        rows = partitions[reference.partition]
        held = locations[reference.partition]
        # loaded.rows holds exactly the wanted rows, each key once: a set
        # intersection in C finds a key another segment holds too.
        twice = rows.keys() & loaded.rows.keys()
        if twice:
            key = min(twice)
            raise DataPlaneCheckpointError(
                segment_path,
                f"key {key!r} of partition {reference.partition!r} is also held from "
                f"segment {held[key][0]!r}",
            )
        rows.update(loaded.rows)
        file = reference.file
        held.update(
            (key, (file, ordinal))
            for ordinal, (key, kept) in enumerate(zip(loaded.keys, wanted, strict=True))
            if kept
        )
        segments[reference.file] = WrittenSegment(
            file=reference.file,
            partition=reference.partition,
            sha256=reference.sha256,
            byte_size=reference.byte_size,
            keys=loaded.keys,
        )
    return LoadedSegmented(
        checkpoint=LoadedCheckpoint(partitions=partitions, user_metadata=content.user_metadata),
        locations=locations,
        segments=segments,
    )


def read_any_checkpoint(directory: Path, segments_dir: Path) -> LoadedSegmented:
    """Read a checkpoint of either version: version 1 has no segments (nothing to seed)."""
    path = directory / METADATA_FILENAME
    if _version(path) == DATA_PLANE_SCHEMA_VERSION:
        return read_segmented(directory, segments_dir)
    return LoadedSegmented(checkpoint=read_checkpoint(directory), locations={}, segments={})


def _version(path: Path) -> int:
    data = read_checkpoint_file(path)
    version, _content = decode_envelope(data, path)
    return version


def checkpoint_summary(directory: Path, segments_dir: Path) -> CheckpointSummary:
    """Read only ``metadata.json`` (either version): row counts, files and sizes, user metadata."""
    path = directory / METADATA_FILENAME
    data = read_checkpoint_file(path)
    version, _content = decode_envelope(data, path)
    if version == DATA_PLANE_SCHEMA_VERSION:
        content = read_segmented_content(directory)
        counts = dict.fromkeys(content.partitions, 0)
        for reference in content.segments:
            counts[reference.partition] += reference.live_rows
        files = tuple((segments_dir / r.file, r.byte_size) for r in content.segments)
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
        if _version(path) == DATA_PLANE_SCHEMA_VERSION:
            files |= {reference.file for reference in read_segmented_content(directory).segments}
    return files
