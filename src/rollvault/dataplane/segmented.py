"""Incremental data-plane checkpoints: rows stored once in segments, snapshots index them.

A segmented checkpoint directory holds only ``metadata.json``, an index of the
segments (:mod:`rollvault.dataplane.segments`) that hold its rows: which of each
segment's rows it holds, never an entry per row, so a snapshot's own bytes stay small
next to its new rows.

The modules of a segmented checkpoint: its on-disk index forms
(:mod:`~rollvault.dataplane.segmented_format`), reading and checking an index
(:mod:`~rollvault.dataplane.segmented_index`), which of a segment's rows an index
holds (:mod:`~rollvault.dataplane.live_ordinals`), writing
(:mod:`~rollvault.dataplane.segmented_writer`); the segments themselves are
:mod:`rollvault.dataplane.segments` and the catalogs
:mod:`rollvault.dataplane.segment_catalog`. This module reads a checkpoint of any
version with its rows, each segment checked against the index
(:func:`open_any_checkpoint`, :func:`read_segmented`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

from rollvault.dataplane.checkpoint_format import (
    METADATA_FILENAME,
    SEGMENTED_SCHEMA_VERSIONS,
    decode_envelope,
    sha256_hex,
)
from rollvault.dataplane.checkpoint_io import (
    LoadedCheckpoint,
    read_checkpoint,
    read_checkpoint_file,
)
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.segment_catalog import WrittenCatalog
from rollvault.dataplane.segmented_index import (
    HeldSegment,
    SegmentedIndex,
    read_segmented_content,
    segmented_index,
)
from rollvault.dataplane.segments import (
    SegmentRows,
    WrittenSegment,
    check_segment_digest,
    decode_segment,
    read_segment_bytes,
)


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
    index = segmented_index(version, content_bytes, path, segments_dir)
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
