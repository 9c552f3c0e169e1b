"""Reading and checking a segmented checkpoint's index, ``metadata.json``, without its rows.

Versions 2 to 5 (:mod:`rollvault.dataplane.segmented_format`) all read into one
:class:`SegmentedIndex`: the partitions, and each held segment (:class:`HeldSegment`,
in the index's order: by file name) with its recorded SHA-256, size and row count and
which of its rows the checkpoint holds. Version 4 and 5 indexes record a segment's
fixed parts in the anchor's catalogs (:mod:`rollvault.dataplane.segment_catalog`),
which are read and checked here; version 5's runs of whole segments are expanded
(:mod:`rollvault.durable.index_runs`) into version 4's list, in its order. Every problem
raises :class:`~rollvault.dataplane.errors.DataPlaneCheckpointError` naming the file
and the field.

Also what the index alone says: a checkpoint's summary (:func:`checkpoint_summary`)
and the segment and catalog files checkpoints reference (:func:`referenced_segments`,
for retention). Reading the rows is :mod:`rollvault.dataplane.segmented`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollvault.dataplane.checkpoint_format import (
    CATALOGUED_SCHEMA_VERSIONS,
    DATA_PLANE_SCHEMA_VERSION,
    METADATA_FILENAME,
    SEGMENTED_SCHEMA_VERSIONS,
    SEGMENTED_V2_SCHEMA_VERSION,
    SEGMENTED_V3_SCHEMA_VERSION,
    decode_content,
    decode_envelope,
    decode_metadata,
)
from rollvault.dataplane.checkpoint_io import read_checkpoint_file
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.live_ordinals import decode_live, decode_live_bitmap
from rollvault.dataplane.segment_catalog import (
    CatalogEntry,
    WrittenCatalog,
    catalog_file_from_name,
    read_catalog,
    require_canonical_name,
    segment_file_from_name,
)
from rollvault.dataplane.segmented_format import (
    CatalogRef,
    HeldEntryV4,
    SegmentedCheckpointContent,
    SegmentedCheckpointContentV3,
    SegmentedCheckpointContentV4,
    SegmentedCheckpointContentV5,
    SegmentEntryV3,
    SegmentReference,
)
from rollvault.durable.index_runs import (
    RunsFormError,
    expand_number_runs,
    in_file_order,
)

_V3_FIELDS = SegmentEntryV3.__struct_fields__
"""A version 3 entry's array positions, named in errors."""
_V4_FIELDS = HeldEntryV4.__struct_fields__
_CATALOG_FIELDS = CatalogRef.__struct_fields__


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


def read_segmented_content(directory: Path, segments_dir: Path | None = None) -> SegmentedIndex:
    """Read and check a segmented ``metadata.json`` of version 2, 3 or 4 (no segment is read;
    version 4's catalogs are, from ``segments_dir``, which it needs).

    Every problem raises :class:`DataPlaneCheckpointError` naming the file and
    the field; any other version is refused naming the file.
    """
    path = directory / METADATA_FILENAME
    version, content_bytes = decode_envelope(read_checkpoint_file(path), path)
    return segmented_index(version, content_bytes, path, segments_dir)


def segmented_index(
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


def checkpoint_summary(directory: Path, segments_dir: Path) -> CheckpointSummary:
    """Read only ``metadata.json`` (any version): row counts, files and sizes, user metadata."""
    path = directory / METADATA_FILENAME
    data = read_checkpoint_file(path)
    version, content_bytes = decode_envelope(data, path)
    if version in SEGMENTED_SCHEMA_VERSIONS:
        content = segmented_index(version, content_bytes, path, segments_dir)
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
            index = segmented_index(version, content_bytes, path, None)
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
