"""The on-disk forms of a segmented data-plane checkpoint's ``metadata.json``, versions 2 to 5.

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
It reads into the same :class:`~rollvault.dataplane.segmented_index.HeldSegment` list
in the same order as version 4.

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
Both read into :class:`~rollvault.dataplane.segmented_index.HeldSegment`.

Reading and checking them is :mod:`rollvault.dataplane.segmented_index`'s job,
writing version 5 :mod:`rollvault.dataplane.segmented_writer`'s.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rollvault.dataplane.checkpoint_format import (
    NonNegativeInt,
    PartitionName,
    Sha256Hex,
)
from rollvault.dataplane.segment_catalog import (
    CatalogFileName,
    SegmentFileName,
    Sha256Bytes,
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
