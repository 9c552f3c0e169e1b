"""Segment catalogs: each row segment's fixed description written once per anchor.

A row segment's description in a data-plane index is mostly fixed from the
moment it is written: its partition, SHA-256, byte size and row count. Only
which of its rows a snapshot still holds changes. Version 3 of
``metadata.json`` repeated the fixed part (~66 of ~80 bytes a row) in every
snapshot for every segment still held, so a long anchor's index grew by two
rows a snapshot (one per partition) and was rewritten whole each time: 14.9 KB
a snapshot after 100 snapshots of one anchor in ``bench_snapshot_cut.py
--incremental 100``, against ~400 KB of new rows (issue 16).

Version 4 moves the fixed parts into **catalog files** beside the segments
(``<anchor>/rollout_snapshots/segments/<stem>-rows.catalog.json``): immutable,
written durably (fsync + atomic rename, fault points ``catalog.before_write``
and ``catalog.durable``) by the snapshot that writes the segments they
describe, before that snapshot commits. ``metadata.json`` then lists the
catalogs it uses (name, SHA-256, size, entry count) and per held segment only
its name, partition and held rows (~11 bytes).

A catalog holds one entry per segment; one segment is described by exactly
one catalog a snapshot lists. Catalogs are never changed; the writer keeps
at most :data:`MAX_CATALOGS` listed by moving the live entries of the catalog
with the fewest into the new one (:func:`catalogs_to_merge`): so restore opens
at most that many small files, and a snapshot rewrites at most about
``1 / MAX_CATALOGS`` of the live segments' entries (the fewest-live catalog
holds at most the average), never all of them at once. Entries of segments
no longer held are left behind and vanish with their catalog once no kept
snapshot lists it (retention, as for segments).

**Format** (strict JSON, decoded with msgspec, never executed):
``{"schema_version": 1, "entries": [[name, partition, sha256, byte_size, row_count], ...]}``,
``name`` as in version 3 (the sequence number the segment's file name derives
from, or the file name as text), ``sha256`` the raw digest (base64 in JSON).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.dataplane.checkpoint_format import NonNegativeInt, PartitionName, sha256_hex
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.segments import (
    WrittenSegment,
    check_segment_digest,
    read_segment_bytes,
    segment_file_name,
)
from rollvault.durable.segment_store import (
    SEQUENCE_DIGITS,
    file_of_sequence_name,
    publish_catalog,
    require_sequence_number,
    sequence_name,
)

CATALOG_SCHEMA_VERSION: Final = 1
SUPPORTED_CATALOG_SCHEMA_VERSIONS: Final = frozenset({CATALOG_SCHEMA_VERSION})
CATALOG_FILE_SUFFIX: Final = ".catalog.json"

MAX_CATALOGS: Final = 16
"""Most catalogs one ``metadata.json`` lists. Restore reads each (~0.1 ms apiece); past it,
the live entries of the catalog with the fewest move into the snapshot's new catalog."""

SegmentFileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.segment\.safetensors$"),
]
CatalogFileName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.catalog\.json$")
]
Sha256Bytes = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
"""A raw SHA-256 digest (base64 in JSON)."""


class CatalogEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One segment's fixed description: ``[name, partition, sha256, byte_size, row_count]``."""

    name: NonNegativeInt | SegmentFileName
    """The sequence number the segment's file name derives from, or the file name as text."""
    partition: PartitionName
    sha256: Sha256Bytes
    byte_size: NonNegativeInt
    row_count: NonNegativeInt

    @property
    def file(self) -> str:
        """The segment's file name."""
        return segment_file_from_name(self.name, self.partition)


class CatalogFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A catalog file's content."""

    schema_version: int
    entries: list[CatalogEntry]


class _VersionProbe(msgspec.Struct):
    schema_version: int


def catalog_file_name(stem: str) -> str:
    """File name of the catalog the snapshot named ``stem`` writes."""
    return f"{stem}-rows{CATALOG_FILE_SUFFIX}"


def catalog_name_field(file: str) -> int | str:
    """How an index names the catalog ``file``: its sequence number, or the name as text."""
    return sequence_name(file, catalog_file_name)


def catalog_file_from_name(name: int | str) -> str:
    """The catalog file an index's ``name`` stands for (see :func:`catalog_name_field`)."""
    return file_of_sequence_name(name, catalog_file_name)


def segment_name_field(file: str, partition: str) -> int | str:
    """A compact row's ``name`` of the segment ``file``: the sequence number where the name is
    ``segment_file_name`` of a zero-padded one and ``partition``, else the name itself."""
    return sequence_name(file, functools.partial(segment_file_name, partition=partition))


def segment_file_from_name(name: int | str, partition: str) -> str:
    """The segment file a compact row's ``name`` stands for (see :func:`segment_name_field`).

    Called per segment of every index read (hundreds in a long anchor's restore): the
    number's file name is built directly, without a partial per call."""
    if isinstance(name, str):
        return name
    return segment_file_name(f"{name:0{SEQUENCE_DIGITS}d}", partition)


def require_canonical_name(name: int | str, partition: str) -> None:
    """Refuse a segment named by text where its sequence number is due (``ValueError``
    naming the field): so ``(name, partition)`` names one file one way, and an index and a
    catalog can be matched on it without building file names."""
    if isinstance(name, str):
        require_sequence_number(name, functools.partial(segment_file_name, partition=partition))


@dataclass(frozen=True)
class WrittenCatalog:
    """A durable catalog: its file, checksum, size, and the segment files it describes."""

    file: str
    sha256: str
    """Hex SHA-256 of the file."""
    byte_size: int
    segments: tuple[str, ...]
    """The segment files of its entries, in entry order."""


def catalog_entry(segment: WrittenSegment) -> CatalogEntry:
    """The catalog entry describing ``segment``."""
    return CatalogEntry(
        name=segment_name_field(segment.file, segment.partition),
        partition=segment.partition,
        sha256=bytes.fromhex(segment.sha256),
        byte_size=segment.byte_size,
        row_count=segment.row_count,
    )


def write_catalog(directory: Path, file: str, segments: Sequence[WrittenSegment]) -> WrittenCatalog:
    """Write the catalog of ``segments`` durably as ``directory/file`` (replacing a failed
    try's file of that name: no committed snapshot lists a name being written)."""
    data = msgspec.json.encode(
        CatalogFile(
            schema_version=CATALOG_SCHEMA_VERSION,
            entries=[catalog_entry(segment) for segment in segments],
        )
    )
    publish_catalog(directory / file, data)
    return WrittenCatalog(
        file=file,
        sha256=sha256_hex(data),
        byte_size=len(data),
        segments=tuple(segment.file for segment in segments),
    )


def read_catalog(path: Path, *, sha256: str, byte_size: int, entry_count: int) -> CatalogFile:
    """Read and check the catalog at ``path`` against what an index records of it.

    Raises :class:`DataPlaneCheckpointError` naming the catalog for a missing or
    unreadable file, another size or SHA-256, an unsupported version, content
    that fails the schema (the field's path), another entry count, or a segment
    it describes twice.
    """
    data = read_segment_bytes(path, byte_size=byte_size, what="catalog")
    check_segment_digest(path, sha256_hex(data), sha256, what="catalog")
    return decode_catalog(path, data, entry_count=entry_count)


def decode_catalog(path: Path, data: bytes, *, entry_count: int) -> CatalogFile:
    """The catalog in ``data`` (already checked against its recorded SHA-256), checked."""
    try:
        catalog = msgspec.json.decode(data, type=CatalogFile, strict=True)
    except msgspec.DecodeError as exc:
        # A version this build does not read is named as such, not as whatever it changed.
        _check_version(path, data)
        raise DataPlaneCheckpointError(path, f"invalid catalog: {exc}") from exc
    if catalog.schema_version not in SUPPORTED_CATALOG_SCHEMA_VERSIONS:
        _check_version(path, data)
    if len(catalog.entries) != entry_count:
        raise DataPlaneCheckpointError(
            path,
            f"catalog holds {len(catalog.entries)} entries, the snapshot records {entry_count}",
        )
    seen: dict[tuple[int | str, str], int] = {}
    for index, entry in enumerate(catalog.entries):
        try:
            require_canonical_name(entry.name, entry.partition)
        except ValueError as exc:
            raise DataPlaneCheckpointError(path, f"$.entries[{index}]{exc}") from exc
        first = seen.setdefault((entry.name, entry.partition), index)
        if first != index:
            raise DataPlaneCheckpointError(
                path,
                f"$.entries[{index}][0] (name): segment {entry.file!r} described twice "
                f"(first at entries[{first}])",
            )
    return catalog


def _check_version(path: Path, data: bytes) -> None:
    """Refuse ``data`` unless its ``schema_version`` is one this build reads (an error of
    another kind is left to the caller)."""
    try:
        version = msgspec.json.decode(data, type=_VersionProbe).schema_version
    except msgspec.DecodeError:
        return
    if version not in SUPPORTED_CATALOG_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, sorted(SUPPORTED_CATALOG_SCHEMA_VERSIONS)))
        raise DataPlaneCheckpointError(
            path, f"unsupported catalog schema_version {version} (this build reads {readable})"
        )


def catalogs_to_merge(
    live: Mapping[str, int], *, adding: bool, limit: int | None = None
) -> list[str]:
    """The catalogs whose live entries move into the new catalog, so that at most ``limit``
    are listed: ``live`` counts each listed catalog's entries of held segments (those
    with none are dropped anyway), ``adding`` says whether a new catalog is written in any
    case. The fewest live first (ties: the oldest name), so a merge rewrites at most the
    average catalog's live entries per catalog it removes (``limit``: default
    :data:`MAX_CATALOGS`)."""
    most = MAX_CATALOGS if limit is None else limit  # read here: the crash tests lower it
    kept = sorted((count, file) for file, count in live.items() if count)
    excess = len(kept) + (1 if adding else 0) - most
    if excess <= 0:
        return []
    # Merging writes a new catalog even when no new segment needs one: one more to remove.
    if not adding:
        excess += 1
    return [file for _count, file in kept[: min(excess, len(kept))]]


@dataclass(frozen=True)
class CatalogPlan:
    """Which catalogs a snapshot lists, and which of its segments its new catalog describes."""

    kept: dict[str, WrittenCatalog]
    """The listed catalogs that stay listed: each describes a held segment, none is merged."""
    moving: list[str]
    """The held segments the new catalog describes, sorted (none: no new catalog): those no
    listed catalog describes (new, or a seeded writer's) and those of the merged catalogs."""


def plan_catalogs(
    listed: Mapping[str, WrittenCatalog], held: Iterable[str], *, limit: int | None = None
) -> CatalogPlan:
    """The catalogs of a snapshot that holds the segment files ``held``, given those the
    previous one ``listed`` (by file): every held segment described by exactly one, at most
    ``limit`` listed (:func:`catalogs_to_merge`), a catalog none of whose segments is held
    no longer listed. The three segment writers (data plane, ledger, facts) share it."""
    catalog_of = {segment: file for file, catalog in listed.items() for segment in catalog.segments}
    held = list(held)
    live = Counter(catalog_of[file] for file in held if file in catalog_of)
    adding = any(file not in catalog_of for file in held)
    merging = set(catalogs_to_merge(live, adding=adding, limit=limit))
    return CatalogPlan(
        kept={file: listed[file] for file in live if file not in merging},
        moving=sorted(
            file for file in held if file not in catalog_of or catalog_of[file] in merging
        ),
    )
