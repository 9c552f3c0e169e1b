"""Writing a data-plane index as version 2, 3 or 4 lists it, for the tests of reading old snapshots."""

from __future__ import annotations

from pathlib import Path

import msgspec

from rollvault.dataplane.checkpoint_format import (
    METADATA_FILENAME,
    SEGMENTED_V2_SCHEMA_VERSION,
    SEGMENTED_V3_SCHEMA_VERSION,
    SEGMENTED_V4_SCHEMA_VERSION,
    encode_envelope,
)
from rollvault.dataplane.live_ordinals import encode_live, encode_live_bitmap
from rollvault.dataplane.segment_catalog import catalog_name_field, segment_name_field
from rollvault.dataplane.segmented_format import (
    CatalogRef,
    HeldEntryV4,
    SegmentedCheckpointContent,
    SegmentedCheckpointContentV3,
    SegmentedCheckpointContentV4,
    SegmentEntryV3,
    SegmentReference,
)
from rollvault.dataplane.segmented_index import HeldSegment, SegmentedIndex, read_segmented_content


def _segments_dir(directory: Path, segments_dir: Path | None) -> Path:
    """The tests' layouts: a data plane directory beside ``segments/`` (the data-plane
    tests), or a snapshot's ``data_plane/`` beside the anchor's ``segments/``."""
    if segments_dir is not None:
        return segments_dir
    beside = directory.parent / "segments"
    return beside if beside.is_dir() else directory.parent.parent / "segments"


def _read(directory: Path, segments_dir: Path | None) -> tuple[SegmentedIndex, dict[str, int]]:
    """The index in ``directory`` and each partition's position in it."""
    index = read_segmented_content(directory, _segments_dir(directory, segments_dir))
    return index, {name: number for number, name in enumerate(index.partitions)}


def _write(directory: Path, content: bytes, version: int) -> Path:
    path = directory / METADATA_FILENAME
    path.write_bytes(encode_envelope(content, version))
    return path


def _held_ordinals(held: HeldSegment) -> list[int]:
    return [ordinal for ordinal, kept in enumerate(held.wanted) if kept]


def index_as_version_2(directory: Path, segments_dir: Path | None = None) -> Path:
    """Rewrite the ``metadata.json`` in ``directory`` (a data-plane checkpoint directory) as
    version 2 lists the same index: each segment an object (file name, hex digest, base64
    bitmap), as the writer before version 3 wrote it. Returns the file's path."""
    index = read_segmented_content(directory, _segments_dir(directory, segments_dir))
    content = SegmentedCheckpointContent(
        partitions=index.partitions,
        segments=[
            SegmentReference(
                file=held.file,
                partition=held.partition,
                sha256=held.sha256,
                byte_size=held.byte_size,
                row_count=held.row_count,
                live_rows=held.live_rows,
                live=encode_live_bitmap(held.row_count, _held_ordinals(held)),
            )
            for held in index.segments
        ],
        user_metadata=index.user_metadata,
    )
    path = directory / METADATA_FILENAME
    path.write_bytes(encode_envelope(msgspec.json.encode(content), SEGMENTED_V2_SCHEMA_VERSION))
    return path


def index_as_version_3(directory: Path, segments_dir: Path | None = None) -> Path:
    """Rewrite the ``metadata.json`` in ``directory`` as version 3 lists the same index (each
    segment's fixed parts in its own row, no catalogs), as main's writer before version 4
    wrote it. Returns the file's path."""
    index, position = _read(directory, segments_dir)
    content = SegmentedCheckpointContentV3(
        partitions=index.partitions,
        segments=[
            SegmentEntryV3(
                name=segment_name_field(held.file, held.partition),
                partition=position[held.partition],
                sha256=bytes.fromhex(held.sha256),
                byte_size=held.byte_size,
                row_count=held.row_count,
                live=encode_live(held.row_count, _held_ordinals(held)),
            )
            for held in sorted(index.segments, key=lambda held: held.file)
        ],
        user_metadata=index.user_metadata,
    )
    return _write(directory, msgspec.json.encode(content), SEGMENTED_V3_SCHEMA_VERSION)


def index_as_version_4(directory: Path, segments_dir: Path | None = None) -> Path:
    """Rewrite the ``metadata.json`` in ``directory`` as version 4 lists the same index (each
    held segment an entry, the all-held ones too; the same catalogs), as main's writer
    before version 5 wrote it. Returns the file's path."""
    index, position = _read(directory, segments_dir)
    content = SegmentedCheckpointContentV4(
        partitions=index.partitions,
        catalogs=[
            CatalogRef(
                name=catalog_name_field(catalog.file),
                sha256=bytes.fromhex(catalog.sha256),
                byte_size=catalog.byte_size,
                entry_count=len(catalog.segments),
            )
            for catalog in index.catalogs
        ],
        segments=[
            HeldEntryV4(
                name=segment_name_field(held.file, held.partition),
                partition=position[held.partition],
                live=encode_live(held.row_count, _held_ordinals(held)),
            )
            for held in sorted(index.segments, key=lambda held: held.file)
        ],
        user_metadata=index.user_metadata,
    )
    return _write(directory, msgspec.json.encode(content), SEGMENTED_V4_SCHEMA_VERSION)
