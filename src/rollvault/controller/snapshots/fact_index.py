"""``group_facts.json``, a snapshot's index of its fact segments: its forms and their reading.

The forms of versions 1 to 5 (their history is :data:`GROUP_FACTS_SCHEMA_VERSION`'s)
and of the fact catalogs that versions 4 and 5 list (:class:`FactCatalogFile`, one
written per snapshot that needs one, as the rows' and the ledger's are); the names of
the fact segment and catalog files; encoding version 5 (:func:`encode_group_facts_file`)
and decoding and checking any version into one :class:`GroupFactsFile`
(:func:`decode_group_facts_file`), version 5's runs of whole segments expanded
(:mod:`rollvault.durable.index_runs`) into version 4's list, in its order; and the
files an index references (:func:`referenced_fact_segments`, for retention). No
fact segment is read here (:mod:`.fact_segments` reads them). Problems raise
:class:`FactsError` naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.controller.snapshots.fact_forms import (
    FACT_SEGMENT_SUFFIX,
    JSON_FACT_SEGMENT_SUFFIX,
)
from rollvault.dataplane.live_ordinals import (
    decode_live,
    decode_live_bitmap,
    encode_live,
    encode_live_bitmap,
)
from rollvault.dataplane.segment_catalog import WrittenCatalog
from rollvault.durable.index_runs import (
    expand_number_runs,
    in_a_run,
    in_file_order,
    number_runs,
)
from rollvault.durable.segment_store import (
    RecordedSegmentError,
    file_of_sequence_name,
    read_recorded_segment,
    require_sequence_number,
    sequence_name,
)

GROUP_FACTS_FILENAME: Final = "group_facts.json"
"""The snapshot's index of its fact segments (advertised like every sidecar)."""
GROUP_FACTS_SCHEMA_VERSION: Final = 5
"""Version 5 (written) is version 4 with the numbered segments all of whose facts are live
(in a long anchor, nearly all: facts rarely die within one) as runs of numbers, ``whole``
(``[first, count]``, maximal), and only the others as version 4's entries, in file-name
order: ~9 bytes a segment (~0.9 KB a snapshot after 100 snapshots of the benchmark's
anchor) become ~10 a run. It reads into version 4's list, in its order. Version 4 lists
each segment by name with its live facts
(:class:`FactHeldEntry`, a few bytes), its fixed row (SHA-256, size, fact count) being
in a **fact catalog** written once per anchor (:class:`FactCatalogFile`), as the ledger's
and the rows' segments are. Version 3 lists each segment as a compact row
(:class:`FactSegmentEntryV3`, ~60 bytes against version 2's ~130: every snapshot of an
anchor repeats every referenced segment's row). Version 2 references form 2 segments
(``*.facts-segment.msgpack``, which hold replay entries too) besides form 1 ones; version
1, form 1 segments only. Versions 1 to 4 are still read."""
SUPPORTED_GROUP_FACTS_SCHEMA_VERSIONS: Final = frozenset({1, 2, 3, 4, 5})
FACT_CATALOG_SCHEMA_VERSION: Final = 1
SUPPORTED_FACT_CATALOG_SCHEMA_VERSIONS: Final = frozenset({FACT_CATALOG_SCHEMA_VERSION})
FACT_CATALOG_SUFFIX: Final = "-facts.catalog.json"
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_INDEX_ENCODER: Final = msgspec.json.Encoder(order="sorted")
FactSegmentFileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.facts-segment\.(json|msgpack)$"),
]


class FactsError(Exception):
    """A group-facts index or fact segment is missing, damaged or inconsistent."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class FactSegmentRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One fact segment a snapshot references, and which of its facts are live."""

    file: FactSegmentFileName
    sha256: _Sha256Hex
    byte_size: _NonNegativeInt
    fact_count: _PositiveInt
    live_facts: _NonNegativeInt
    live: str
    """Base64 of the bitmap of live ordinals (little-endian bit order)."""


class FactSegmentRow(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A :class:`FactSegmentRef` as version 2 writes it: ``[file, sha256, byte_size,
    fact_count, live_facts, live]``, its bounds kept, without the field names."""

    file: FactSegmentFileName
    sha256: _Sha256Hex
    byte_size: _NonNegativeInt
    fact_count: _PositiveInt
    live_facts: _NonNegativeInt
    live: str

    @classmethod
    def of(cls, ref: FactSegmentRef) -> FactSegmentRow:
        return cls(ref.file, ref.sha256, ref.byte_size, ref.fact_count, ref.live_facts, ref.live)

    def ref(self) -> FactSegmentRef:
        return FactSegmentRef(
            file=self.file,
            sha256=self.sha256,
            byte_size=self.byte_size,
            fact_count=self.fact_count,
            live_facts=self.live_facts,
            live=self.live,
        )


class _GroupFactsFileV2(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json`` version 2 as it is on disk: each segment a row."""

    schema_version: int
    segments: list[FactSegmentRow]


class FactSegmentEntryV3(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A :class:`FactSegmentRef` as version 3 writes it: ``[name, sha256, byte_size,
    fact_count, live]``, the data plane's compact forms (its ``metadata.json`` version 3)."""

    name: _NonNegativeInt | FactSegmentFileName
    """The snapshot sequence number the file name derives from
    (:func:`fact_segment_file_name` of it, zero-padded), or the file name as text."""
    sha256: Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
    """The raw digest (base64 in JSON)."""
    byte_size: _NonNegativeInt
    fact_count: _PositiveInt
    live: list[_NonNegativeInt] | bytes
    """Live ordinals: ``[]`` when all are, else run lengths (live first, then alternately
    dead and live) or the bitmap's raw bytes, whichever is shorter
    (:func:`~rollvault.dataplane.live_ordinals.encode_live`); the live count is derived."""

    def __post_init__(self) -> None:
        # Part of the schema: a writer's own segment is named by its number only.
        require_sequence_number(self.name, fact_segment_file_name)


class FactCatalogEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A fact segment's fixed row in a fact catalog: ``[name, sha256, byte_size, fact_count]``
    (version 3's row without its live facts)."""

    name: _NonNegativeInt | FactSegmentFileName
    sha256: Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
    byte_size: _NonNegativeInt
    fact_count: _PositiveInt

    def __post_init__(self) -> None:
        require_sequence_number(self.name, fact_segment_file_name)


class FactCatalogFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A fact catalog's content (``<stem>-facts.catalog.json``, strict JSON)."""

    schema_version: int
    entries: list[FactCatalogEntry]


FactCatalogFileName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}-facts\.catalog\.json$")
]


def fact_catalog_file_name(stem: str) -> str:
    """The name of the fact catalog the snapshot named ``stem`` writes."""
    return f"{stem}{FACT_CATALOG_SUFFIX}"


class FactCatalogRef(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A catalog a version 4 index uses: ``[name, sha256, byte_size, entry_count]``."""

    name: _NonNegativeInt | FactCatalogFileName
    sha256: Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
    byte_size: _NonNegativeInt
    entry_count: _PositiveInt

    def __post_init__(self) -> None:
        require_sequence_number(self.name, fact_catalog_file_name)

    @property
    def file(self) -> str:
        return file_of_sequence_name(self.name, fact_catalog_file_name)


class FactHeldEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A segment a version 4 index references: ``[name, live]`` (``live`` as version 3's)."""

    name: _NonNegativeInt | FactSegmentFileName
    live: list[_NonNegativeInt] | bytes

    def __post_init__(self) -> None:
        require_sequence_number(self.name, fact_segment_file_name)


class _GroupFactsFileV3(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json`` version 3 as it is on disk: each segment a compact row."""

    schema_version: int
    segments: list[FactSegmentEntryV3]


class _GroupFactsFileV4(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json`` version 4 as it is on disk: catalogs, then each segment held."""

    schema_version: int
    catalogs: list[FactCatalogRef]
    segments: list[FactHeldEntry]


class _GroupFactsFileV5(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json`` version 5 as it is on disk: catalogs, the numbered segments whose
    facts are all live as runs ``[first, count]``, then each other segment held."""

    schema_version: int
    catalogs: list[FactCatalogRef]
    whole: list[tuple[_NonNegativeInt, _NonNegativeInt]]
    segments: list[FactHeldEntry]


def _catalog_ref(catalog: WrittenCatalog) -> FactCatalogRef:
    """The row by which a version 4 or 5 index lists the fact catalog ``catalog``."""
    return FactCatalogRef(
        sequence_name(catalog.file, fact_catalog_file_name),
        bytes.fromhex(catalog.sha256),
        catalog.byte_size,
        len(catalog.segments),
    )


def _entry_v3(ref: FactSegmentRef) -> FactSegmentEntryV3:
    """``ref`` as a version 3 row (its bitmap was checked when the writer built it)."""
    bits = decode_live_bitmap(ref.live, ref.fact_count, ref.live_facts)
    held = [ordinal for ordinal, live in enumerate(bits) if live]
    return FactSegmentEntryV3(
        name=fact_segment_name_field(ref.file),
        sha256=bytes.fromhex(ref.sha256),
        byte_size=ref.byte_size,
        fact_count=ref.fact_count,
        live=encode_live(ref.fact_count, held),
    )


def _ref_v3(entry: FactSegmentEntryV3, where: str, live_field: str = "[4]") -> FactSegmentRef:
    """The :class:`FactSegmentRef` a version 3 row stands for; ``ValueError`` naming the
    field at ``where`` (``live_field``: the live facts' place in the row) when its live
    ordinals do not fit its fact count."""
    try:
        bits = decode_live(entry.live, entry.fact_count)
    except ValueError as exc:
        raise ValueError(f"{where}{live_field} (live): {exc}") from exc
    held = [ordinal for ordinal, live in enumerate(bits) if live]
    return FactSegmentRef(
        file=fact_segment_file_from_name(entry.name),
        sha256=entry.sha256.hex(),
        byte_size=entry.byte_size,
        fact_count=entry.fact_count,
        live_facts=len(held),
        live=encode_live_bitmap(entry.fact_count, held),
    )


def fact_segment_name_field(file: str) -> int | str:
    """Version 3's ``name`` of ``file``: the sequence number when the name is this writer's
    for a zero-padded one, else the name itself (a form 1 segment, another writer's)."""
    return sequence_name(file, fact_segment_file_name)


def fact_segment_file_from_name(name: int | str) -> str:
    """The file name version 3's ``name`` stands for (see :func:`fact_segment_name_field`)."""
    return file_of_sequence_name(name, fact_segment_file_name)


class _Versioned(msgspec.Struct):
    schema_version: int


class GroupFactsFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json``: the fact segments a snapshot references (version 1 on disk
    exactly; version 2 writes each as a :class:`FactSegmentRow`, version 3 as a
    :class:`FactSegmentEntryV3`)."""

    schema_version: int
    segments: list[FactSegmentRef]

    @property
    def live_facts(self) -> int:
        """Live facts over every referenced segment (advertised as the file's group count)."""
        return sum(ref.live_facts for ref in self.segments)


def fact_segment_file_name(stem: str) -> str:
    """The name of the fact segment the snapshot named ``stem`` writes."""
    return f"{stem}-facts{FACT_SEGMENT_SUFFIX}"


def encode_group_facts_file(
    index: GroupFactsFile, catalogs: Mapping[str, WrittenCatalog] | None = None
) -> bytes:
    """The bytes of ``group_facts.json`` for ``index``: version 5, its segments' rows in
    ``catalogs`` (durable already: :attr:`~.fact_writer.PendingFacts.catalogs`); without
    catalogs version 3, each segment a compact row (what was written before catalogs:
    tests of reading it)."""
    entries = [_entry_v3(ref) for ref in index.segments]
    if catalogs is None:
        return _INDEX_ENCODER.encode(_GroupFactsFileV3(schema_version=3, segments=entries))
    held = [FactHeldEntry(entry.name, entry.live) for entry in entries]
    numbers = sorted(
        entry.name for entry in held if in_a_run(entry) and isinstance(entry.name, int)
    )
    on_disk = _GroupFactsFileV5(
        schema_version=GROUP_FACTS_SCHEMA_VERSION,
        catalogs=[_catalog_ref(catalogs[file]) for file in sorted(catalogs)],
        whole=number_runs(numbers),
        segments=[entry for entry in held if not in_a_run(entry)],
    )
    return _INDEX_ENCODER.encode(on_disk)


def decode_group_facts_file(
    path: Path, data: bytes, segments_dir: Path | None = None
) -> GroupFactsFile:
    """``group_facts.json``'s bytes, strictly decoded and checked (no segment is read; a
    version 4 index's catalogs are, in ``segments_dir``, which it needs)."""
    try:
        version = msgspec.json.decode(data, type=_Versioned, strict=True).schema_version
        if version not in SUPPORTED_GROUP_FACTS_SCHEMA_VERSIONS:
            supported = ", ".join(map(str, sorted(SUPPORTED_GROUP_FACTS_SCHEMA_VERSIONS)))
            raise FactsError(path, f"unsupported schema_version {version} (supported: {supported})")
        if version == 1:
            index = msgspec.json.decode(data, type=GroupFactsFile, strict=True)
        elif version == 2:
            rows = msgspec.json.decode(data, type=_GroupFactsFileV2, strict=True)
            index = GroupFactsFile(
                schema_version=version, segments=[row.ref() for row in rows.segments]
            )
        elif version in (4, 5):
            if segments_dir is None:
                raise FactsError(path, f"version {version} is read with its catalogs' directory")
            catalogs, held = _held_v4(path, data, version)
            index = _index_v4(path, version, catalogs, held, segments_dir)
        else:
            entries = msgspec.json.decode(data, type=_GroupFactsFileV3, strict=True)
            index = GroupFactsFile(
                schema_version=version,
                segments=[
                    _ref_v3(entry, f"$.segments[{position}]")
                    for position, entry in enumerate(entries.segments)
                ],
            )
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise FactsError(path, str(exc)) from exc
    seen: set[str] = set()
    for position, ref in enumerate(index.segments):
        if ref.file in seen:
            raise FactsError(path, f"$.segments[{position}].file: {ref.file!r} listed twice")
        if index.schema_version == 1 and not ref.file.endswith(JSON_FACT_SEGMENT_SUFFIX):
            raise FactsError(
                path, f"$.segments[{position}].file: version 1 lists form 1 segments only"
            )
        seen.add(ref.file)
    return index


_Listed = list[tuple[str, FactHeldEntry]]
"""An index's held segments in its order, each with where it is listed."""


def _held_v4(path: Path, data: bytes, version: int) -> tuple[list[FactCatalogRef], _Listed]:
    """A version 4 or 5 index's catalogs and held segments (version 4's list, in its order:
    version 5's runs expanded and merged by file name). ``ValueError`` naming the run or
    entry of a version 5 index out of its one spelling (runs maximal, never empty; an
    entry that belongs in a run, out of order, or in a run too)."""
    if version == 4:
        held = msgspec.json.decode(data, type=_GroupFactsFileV4, strict=True)
        return held.catalogs, [(f"$.segments[{p}]", e) for p, e in enumerate(held.segments)]
    held5 = msgspec.json.decode(data, type=_GroupFactsFileV5, strict=True)
    try:
        numbers = expand_number_runs(held5.whole)
    except ValueError as exc:
        raise ValueError(f"$.whole{exc}") from exc
    whole = [
        (fact_segment_file_from_name(n), (f"$.whole (segment {n})", FactHeldEntry(n, [])))
        for n in numbers
    ]
    others = [
        (fact_segment_file_from_name(entry.name), entry, (f"$.segments[{position}]", entry))
        for position, entry in enumerate(held5.segments)
    ]
    try:
        return held5.catalogs, in_file_order(whole, others)
    except ValueError as exc:
        raise ValueError(f"$.segments{exc}") from exc


def _index_v4(
    path: Path,
    version: int,
    catalogs: Sequence[FactCatalogRef],
    held: _Listed,
    segments_dir: Path,
) -> GroupFactsFile:
    """Version 4's (and 5's) index with each segment's row from its catalog (a segment in
    none of the listed catalogs is refused naming its place; ``ValueError`` for a live
    field that does not fit, as version 3's)."""
    rows = _catalog_rows(path, catalogs, segments_dir)
    refs = []
    for where, entry in held:
        file = fact_segment_file_from_name(entry.name)
        row = rows.get(file)
        if row is None:
            raise FactsError(
                path, f"{where}[0] (name): segment {file!r} is in none of its catalogs"
            )
        compact = FactSegmentEntryV3(
            entry.name, row.sha256, row.byte_size, row.fact_count, entry.live
        )
        refs.append(_ref_v3(compact, where, live_field="[1]"))
    return GroupFactsFile(schema_version=version, segments=refs)


def _catalog_rows(
    path: Path, catalogs: Sequence[FactCatalogRef], segments_dir: Path
) -> dict[str, FactCatalogEntry]:
    """Every row of the listed catalogs, by segment file: each catalog listed once, read and
    checked against what the index records of it, each segment described once."""
    rows: dict[str, FactCatalogEntry] = {}
    listed: dict[str, int] = {}
    for position, catalog in enumerate(catalogs):
        if listed.setdefault(catalog.file, position) != position:
            raise FactsError(path, f"$.catalogs[{position}]: catalog {catalog.file!r} listed twice")
        catalog_path = segments_dir / catalog.file
        try:
            data = read_recorded_segment(
                catalog_path,
                what="fact catalog",
                byte_size=catalog.byte_size,
                sha256=catalog.sha256.hex(),
                recorded_in=GROUP_FACTS_FILENAME,
            )
        except RecordedSegmentError as exc:
            raise FactsError(exc.path, exc.problem) from exc
        for index, entry in enumerate(
            _decode_fact_catalog(catalog_path, data, catalog.entry_count)
        ):
            file = fact_segment_file_from_name(entry.name)
            if file in rows:
                raise FactsError(
                    catalog_path,
                    f"$.entries[{index}][0] (name): segment {file!r} is described twice",
                )
            rows[file] = entry
    return rows


def _decode_fact_catalog(path: Path, data: bytes, entry_count: int) -> list[FactCatalogEntry]:
    """A fact catalog's entries, strictly decoded: its version one this build reads, and as
    many entries as the index records."""
    try:
        version = msgspec.json.decode(data, type=_Versioned).schema_version
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FactsError(path, f"not a fact catalog: {exc}") from exc
    if version not in SUPPORTED_FACT_CATALOG_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, sorted(SUPPORTED_FACT_CATALOG_SCHEMA_VERSIONS)))
        raise FactsError(
            path, f"$.schema_version: {version}; this build reads catalog versions {readable}"
        )
    try:
        catalog = msgspec.json.decode(data, type=FactCatalogFile, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FactsError(path, f"invalid fact catalog: {exc}") from exc
    if len(catalog.entries) != entry_count:
        raise FactsError(
            path,
            f"holds {len(catalog.entries)} entries, {GROUP_FACTS_FILENAME} records {entry_count}",
        )
    return catalog.entries


def referenced_fact_segments(path: Path, data: bytes) -> set[str]:
    """The fact segment files the index ``path`` (bytes ``data``) lists, and from version 4
    its catalogs (what retention keeps; no catalog is read)."""
    try:
        version = msgspec.json.decode(data, type=_Versioned, strict=True).schema_version
        if version in (4, 5):
            catalogs, held = _held_v4(path, data, version)
            files = {catalog.file for catalog in catalogs}
            return files | {fact_segment_file_from_name(entry.name) for _where, entry in held}
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise FactsError(path, str(exc)) from exc
    return {ref.file for ref in decode_group_facts_file(path, data).segments}
