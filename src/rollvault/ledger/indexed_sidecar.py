"""The indexed ledger sidecar (version 6): group records in ledger segments, the file an index.

Version 5 and before write every group of the ledger into the sidecar at every
snapshot. From version 6 each group's record is written once per change into
a **ledger segment**, an immutable file of records
(:mod:`rollvault.ledger.ledger_records`: form 1 holds whole records, a
version 5 ledger state; forms 2 to 4 whole or *delta* records, a delta
holding only the siblings (forms 3 and 4: the attempts; form 4, written now,
also an attempt whose status alone changed as that status) that changed
since its base record). The
sidecar itself holds the controller state as before plus an index: the
segments it references (name, SHA-256, size, record count), every segment
a live group's chain of records reaches included, and, in ledger order,
which record of which segment is each live group's newest one. A group
unchanged since the previous snapshot costs an index entry. (The sidecar's
own fields are those of version 6 before delta records; the segment's form
says how to read it, so the file's version stays 6.)

Version 7 holds the finalizer maps apart (the snapshot layer's group facts),
version 8 writes the index's groups as runs (:data:`RUNS_SIDECAR_SCHEMA_VERSION`),
and version 9 each listed segment as a compact row
(:data:`COMPACT_SIDECAR_SCHEMA_VERSION`); all decode to version 6's state.

This module is the format only (no I/O): building and decoding the sidecar,
and assembling a decoded index and its segments into the same
:class:`~rollvault.ledger.sidecar.ParsedRolloutRecoveryState` a version 5
sidecar decodes to, through the same checks. Which segments exist, where
they live and when they are deleted is the snapshot layer's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, TypeVar

import msgspec

from rollvault.durable.index_runs import keyed_runs
from rollvault.durable.segment_store import (
    file_of_sequence_name,
    require_sequence_number,
    sequence_name,
)
from rollvault.ledger.checked_groups import CheckedGroups, GroupSource
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.ledger_records import (
    LEDGER_SEGMENT_SUFFIX,
    LedgerSegmentFileName,
    RecordChain,
    SegmentRecords,
    resolve_group_source,
)
from rollvault.ledger.reward_penalties import CaptureRewardSettings
from rollvault.ledger.sidecar import (
    ParsedRolloutRecoveryState,
    parsed_from_checked_groups,
    sidecar_envelope_fields,
)
from rollvault.ledger.state_schema import (
    RolloutRecoveryState,
)

INDEXED_SIDECAR_SCHEMA_VERSION: Final = 6
"""The sidecar file's version when its ledger is in segments (version 5 and before: inline)."""

_WHAT: Final = "rollout recovery sidecar"
_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class LedgerSegmentRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One ledger segment a sidecar holds records of."""

    file: LedgerSegmentFileName
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    byte_size: _NonNegativeInt
    record_count: Annotated[int, msgspec.Meta(ge=1)]


class LedgerIndex(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Where each live group's current record is."""

    segments: list[LedgerSegmentRef]
    groups: list[tuple[_NonNegativeInt, _NonNegativeInt]]
    """Per live group, in ledger (reservation) order: (position in ``segments``, record ordinal)."""


class IndexedSidecarState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A version 6 ``rollout_recovery.json``: the version 5 envelope with an index for a ledger."""

    schema_version: int
    ledger_index: LedgerIndex
    batch_shortfall: dict[str, Any]
    sampler_stamps_target_steps: bool | None
    finalizer_metrics_by_group: dict[str, Any]
    finalizer_rewards_by_group: dict[str, Any]
    reward_settings: CaptureRewardSettings | None


class _VersionOnly(msgspec.Struct):
    schema_version: int


class _IndexOnly(msgspec.Struct):
    ledger_index: LedgerIndex


def ledger_segment_file_name(stem: str) -> str:
    """The name of the ledger segment the snapshot named ``stem`` writes."""
    return f"{stem}-ledger{LEDGER_SEGMENT_SUFFIX}"


def encode_indexed_sidecar(envelope: RolloutRecoveryState, index: LedgerIndex) -> bytes:
    """A version 6 sidecar: ``envelope`` (:func:`~rollvault.ledger.sidecar.build_sidecar_envelope`)
    with ``index``."""
    missing = sorted(sidecar_envelope_fields() - envelope.keys())
    extra = sorted(envelope.keys() - sidecar_envelope_fields())
    if missing or extra:
        raise LedgerStateError(
            f"{_WHAT}: the envelope lacks {missing} / has unknown fields {extra}"
        )
    state = dict(envelope, schema_version=INDEXED_SIDECAR_SCHEMA_VERSION, ledger_index=index)
    try:
        return _ENCODER.encode(state)
    except (TypeError, msgspec.EncodeError) as exc:
        raise LedgerStateError(f"{_WHAT}: not JSON-safe builtins: {exc}") from exc


def sidecar_file_version(data: bytes) -> int | None:
    """The ``schema_version`` of a sidecar file's bytes, or None if they have none."""
    try:
        return msgspec.json.decode(data, type=_VersionOnly).schema_version
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode_indexed_sidecar(data: bytes) -> IndexedSidecarState:
    """A version 6 sidecar's bytes, strictly decoded (the ledger's records are not read)."""
    try:
        state = msgspec.json.decode(data, type=IndexedSidecarState, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{_WHAT}: {exc}") from exc
    if state.schema_version != INDEXED_SIDECAR_SCHEMA_VERSION:
        raise LedgerStateError(
            f"{_WHAT} $.schema_version: {state.schema_version} is not the indexed version "
            f"{INDEXED_SIDECAR_SCHEMA_VERSION}"
        )
    return state


def decode_ledger_index(data: bytes) -> LedgerIndex:
    """Only the index of a version 6 sidecar (what segment retention needs)."""
    try:
        return msgspec.json.decode(data, type=_IndexOnly, strict=True).ledger_index
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{_WHAT} $.ledger_index: {exc}") from exc


def assemble_indexed_sidecar(
    state: IndexedSidecarState, segments: Mapping[str, SegmentRecords]
) -> ParsedRolloutRecoveryState:
    """The parsed sidecar of ``state``, its records taken from ``segments`` (file -> records)."""
    return assemble_indexed_ledger(state, segments)[0]


def assemble_indexed_ledger(
    state: IndexedSidecarState, segments: Mapping[str, SegmentRecords]
) -> tuple[ParsedRolloutRecoveryState, list[RecordChain]]:
    """The parsed sidecar of ``state`` and, per live group in index order, its chain of records.

    Every rule a version 5 sidecar is held to applies (the groups become the
    records a restore loads, checked by the version 5 state's rules:
    :mod:`rollvault.ledger.checked_groups`), plus the index's own: each entry
    names a listed segment and one of its records, every base a chain reaches
    is in a listed segment, and no record is reached twice
    (:func:`~rollvault.ledger.ledger_records.resolve_group`).
    """
    refs = state.ledger_index.segments
    listed = {ref.file: segments[ref.file] for ref in refs}
    groups: list[GroupSource] = []
    chains: list[RecordChain] = []
    used: set[tuple[str, int]] = set()
    for position, (segment, ordinal) in enumerate(state.ledger_index.groups):
        where = f"{_WHAT} $.ledger_index.groups[{position}]"
        if segment >= len(refs):
            raise LedgerStateError(f"{where}: segment {segment} of {len(refs)} listed")
        group, chain = resolve_group_source(
            (refs[segment].file, ordinal), listed, used, where=where
        )
        groups.append(group)
        chains.append(chain)
    # The records a restore loads, built from the decoded pieces and checked as a
    # version 5 ledger state is (the same rules, the same paths in messages).
    checked = CheckedGroups(groups, path="$.ledger.groups")
    parsed = parsed_from_checked_groups(checked, state)
    return parsed, chains


# -- version 7: the finalizer maps held apart ------------------------------------------

FACTS_APART_SIDECAR_SCHEMA_VERSION: Final = 7
"""The sidecar file's version when, besides its ledger, its finalizer maps are held apart.

Per canonical group the finalizer's rewards and metrics are written once, by
the snapshot layer, into its group facts (a canonical group's finalization
never changes), instead of into every snapshot's sidecar. The file is
version 6 without ``finalizer_metrics_by_group`` and
``finalizer_rewards_by_group``; whoever reads it supplies them
(:func:`decode_facts_apart_sidecar`), and they are then checked as a version
6 sidecar's are."""

_FINALIZER_MAPS: Final = frozenset({"finalizer_metrics_by_group", "finalizer_rewards_by_group"})


class FactsApartSidecarState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A version 7 ``rollout_recovery.json``: version 6 without the finalizer maps."""

    schema_version: int
    ledger_index: LedgerIndex
    batch_shortfall: dict[str, Any]
    sampler_stamps_target_steps: bool | None
    reward_settings: CaptureRewardSettings | None


def decode_facts_apart_sidecar(
    data: bytes,
    *,
    finalizer_metrics_by_group: dict[str, Any],
    finalizer_rewards_by_group: dict[str, Any],
) -> IndexedSidecarState:
    """A version 7 sidecar's bytes, strictly decoded, with the finalizer maps the caller
    read from where they are held; assemble it as a version 6 one
    (:func:`assemble_indexed_ledger`), which checks the maps too."""
    state = _decode_versioned(data, FactsApartSidecarState, FACTS_APART_SIDECAR_SCHEMA_VERSION)
    return _with_finalizer_maps(
        state,
        state.ledger_index,
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
    )


_Versioned = TypeVar(
    "_Versioned",
    "FactsApartSidecarState",
    "RunsSidecarState",
    "CompactSidecarState",
    "CatalogSidecarState",
)


def _decode_versioned(data: bytes, kind: type[_Versioned], version: int) -> _Versioned:
    """``data`` strictly decoded as ``kind``, whose ``schema_version`` must be ``version``."""
    try:
        state = msgspec.json.decode(data, type=kind, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{_WHAT}: {exc}") from exc
    if state.schema_version != version:
        raise LedgerStateError(
            f"{_WHAT} $.schema_version: {state.schema_version} is not the version "
            f"{version} this decoder reads"
        )
    return state


def _with_finalizer_maps(
    state: FactsApartSidecarState | RunsSidecarState | CompactSidecarState | CatalogSidecarState,
    index: LedgerIndex,
    *,
    finalizer_metrics_by_group: dict[str, Any],
    finalizer_rewards_by_group: dict[str, Any],
) -> IndexedSidecarState:
    """A sidecar that holds its finalizer maps apart, as version 6 holds it, with the maps."""
    return IndexedSidecarState(
        schema_version=INDEXED_SIDECAR_SCHEMA_VERSION,
        ledger_index=index,
        batch_shortfall=state.batch_shortfall,
        sampler_stamps_target_steps=state.sampler_stamps_target_steps,
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
        reward_settings=state.reward_settings,
    )


# -- version 8: the index's groups as runs ---------------------------------------------

RUNS_SIDECAR_SCHEMA_VERSION: Final = 8
"""The sidecar file's version when its index lists the live groups' records as runs.

Version 7's index names each live group's newest record as a pair,
``[segment position, ordinal]``: ~8 bytes a group, 10.8 KB at 1,024 groups
in every snapshot, though the groups unchanged since a segment was written
sit there in ledger order, one after the other. Version 8 is version 7 with
``ledger_index.groups`` written as ``ledger_index.runs`` (and each listed segment as an array, :class:`LedgerSegmentRow`): triples
``[segment position, first ordinal, count]`` standing for the pairs
``[segment position, first ordinal + k]``, k < count, in ledger order (~90
runs at 1,024 groups in the benchmark's steady state). Decoded, it is version
7's index exactly (:func:`decode_runs_sidecar`), checked as one: an error
names the group by its place in the expanded list, ``$.ledger_index.groups[k]``."""


class LedgerSegmentRow(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A :class:`LedgerSegmentRef` as version 8 writes it: ``[file, sha256, byte_size,
    record_count]``, its bounds kept, without the field names every snapshot repeated."""

    file: LedgerSegmentFileName
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    byte_size: _NonNegativeInt
    record_count: Annotated[int, msgspec.Meta(ge=1)]

    @classmethod
    def of(cls, ref: LedgerSegmentRef) -> LedgerSegmentRow:
        return cls(ref.file, ref.sha256, ref.byte_size, ref.record_count)

    def ref(self) -> LedgerSegmentRef:
        return LedgerSegmentRef(
            file=self.file,
            sha256=self.sha256,
            byte_size=self.byte_size,
            record_count=self.record_count,
        )


class LedgerRunsIndex(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Version 8's index: :class:`LedgerIndex` with its segments as rows, its groups as runs."""

    segments: list[LedgerSegmentRow]
    runs: list[tuple[_NonNegativeInt, _NonNegativeInt, Annotated[int, msgspec.Meta(ge=1)]]]
    """``(position in segments, first record ordinal, count)``, in ledger order."""


class RunsSidecarState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A version 8 ``rollout_recovery.json``: version 7 with the index's groups as runs."""

    schema_version: int
    ledger_index: LedgerRunsIndex
    batch_shortfall: dict[str, Any]
    sampler_stamps_target_steps: bool | None
    reward_settings: CaptureRewardSettings | None


class _RunsIndexOnly(msgspec.Struct):
    ledger_index: LedgerRunsIndex


def index_runs(index: LedgerIndex) -> LedgerRunsIndex:
    """``index`` with its groups as runs of consecutive ordinals in one segment."""
    segments = [LedgerSegmentRow.of(ref) for ref in index.segments]
    return LedgerRunsIndex(segments=segments, runs=keyed_runs(index.groups))


def expand_runs(index: LedgerRunsIndex) -> LedgerIndex:
    """The version 7 index ``index`` stands for.

    A run must lie within its segment's records (which also bounds what a damaged
    count can make this build); anything else about the pairs is checked where
    version 7's are (:func:`assemble_indexed_ledger`).
    """
    return _expand([row.ref() for row in index.segments], index.runs)


def _expand(refs: list[LedgerSegmentRef], runs: list[tuple[int, int, int]]) -> LedgerIndex:
    """The version 7 index of ``refs`` and ``runs`` (see :func:`expand_runs`)."""
    groups: list[tuple[int, int]] = []
    for position, (segment, first, count) in enumerate(runs):
        where = f"{_WHAT} $.ledger_index.runs[{position}]"
        if segment >= len(refs):
            raise LedgerStateError(f"{where}: segment {segment} of {len(refs)} listed")
        if first + count > refs[segment].record_count:
            raise LedgerStateError(
                f"{where}: records {first}..{first + count - 1} of {refs[segment].file!r}, "
                f"which holds {refs[segment].record_count}"
            )
        groups.extend((segment, ordinal) for ordinal in range(first, first + count))
    return LedgerIndex(segments=refs, groups=groups)


def encode_runs_sidecar(envelope: RolloutRecoveryState, index: LedgerIndex) -> bytes:
    """A version 8 sidecar: ``envelope`` with ``index`` (its groups as runs), its finalizer
    maps left out (the caller stores them elsewhere). Written before version 9; kept to
    write what older snapshots hold (tests of reading them)."""
    return _encode_apart(envelope, RUNS_SIDECAR_SCHEMA_VERSION, index_runs(index))


def _encode_apart(
    envelope: RolloutRecoveryState,
    version: int,
    index: LedgerRunsIndex | LedgerCompactIndex | LedgerCatalogIndex,
) -> bytes:
    """``envelope`` as a sidecar of ``version`` with ``index``, its finalizer maps left out."""
    missing = sorted(sidecar_envelope_fields() - envelope.keys())
    extra = sorted(envelope.keys() - sidecar_envelope_fields())
    if missing or extra:
        raise LedgerStateError(
            f"{_WHAT}: the envelope lacks {missing} / has unknown fields {extra}"
        )
    state = {key: value for key, value in envelope.items() if key not in _FINALIZER_MAPS}
    state.update(schema_version=version, ledger_index=index)
    try:
        return _ENCODER.encode(state)
    except (TypeError, msgspec.EncodeError) as exc:
        raise LedgerStateError(f"{_WHAT}: not JSON-safe builtins: {exc}") from exc


def decode_runs_sidecar(
    data: bytes,
    *,
    finalizer_metrics_by_group: dict[str, Any],
    finalizer_rewards_by_group: dict[str, Any],
) -> IndexedSidecarState:
    """A version 8 sidecar's bytes, strictly decoded, its runs expanded, with the finalizer
    maps the caller read from where they are held (as :func:`decode_facts_apart_sidecar`)."""
    state = _decode_versioned(data, RunsSidecarState, RUNS_SIDECAR_SCHEMA_VERSION)
    return _with_finalizer_maps(
        state,
        expand_runs(state.ledger_index),
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
    )


def referenced_ledger_segment_files(data: bytes) -> set[str]:
    """The ledger segment files a sidecar of version 6 or later lists, and from version 10
    its ledger catalogs (what retention keeps)."""
    version = sidecar_file_version(data)
    if version == CATALOG_SIDECAR_SCHEMA_VERSION:
        return referenced_catalog_sidecar_files(data)
    if version is not None and version > CATALOG_SIDECAR_SCHEMA_VERSION:
        raise LedgerStateError(f"{_WHAT}: unsupported schema_version {version}")
    if version not in (RUNS_SIDECAR_SCHEMA_VERSION, COMPACT_SIDECAR_SCHEMA_VERSION):
        return {ref.file for ref in decode_ledger_index(data).segments}
    try:
        if version == RUNS_SIDECAR_SCHEMA_VERSION:
            rows = msgspec.json.decode(data, type=_RunsIndexOnly, strict=True).ledger_index
            return {row.file for row in rows.segments}
        compact = msgspec.json.decode(data, type=_CompactIndexOnly, strict=True).ledger_index
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{_WHAT} $.ledger_index: {exc}") from exc
    return {row.ref().file for row in compact.segments}


# -- version 9: each listed segment as a compact row -----------------------------------

COMPACT_SIDECAR_SCHEMA_VERSION: Final = 9
"""The sidecar file's version when its index lists each segment as a compact row.

Every snapshot of an anchor lists every ledger segment a live group's chain reaches,
one more each snapshot until compaction drops some: version 8's row, ``[file, hex
sha256, byte_size, record_count]``, is ~120 bytes (~8 KB at round 30 of the
benchmark's anchor, +~120 bytes a round). Version 9's (:class:`LedgerSegmentEntryV9`)
names a segment by the sequence number its file name derives from and holds the raw
digest (base64 in JSON): ~60 bytes. Decoded, it is version 8 (and so version 7)
exactly."""


class LedgerSegmentEntryV9(
    msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True
):
    """A :class:`LedgerSegmentRef` as version 9 writes it: ``[name, sha256, byte_size,
    record_count]``."""

    name: _NonNegativeInt | LedgerSegmentFileName
    """The sequence number when the file name is :func:`ledger_segment_file_name` of it,
    zero-padded; else the file name as text (a cold segment's, another writer's)."""
    sha256: Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
    """The raw digest (base64 in JSON)."""
    byte_size: _NonNegativeInt
    record_count: Annotated[int, msgspec.Meta(ge=1)]

    def __post_init__(self) -> None:
        # Part of the schema: a writer's own segment is named by its number only.
        require_sequence_number(self.name, ledger_segment_file_name)

    @classmethod
    def of(cls, ref: LedgerSegmentRef) -> LedgerSegmentEntryV9:
        return cls(
            sequence_name(ref.file, ledger_segment_file_name),
            bytes.fromhex(ref.sha256),
            ref.byte_size,
            ref.record_count,
        )

    def ref(self) -> LedgerSegmentRef:
        name = self.name
        return LedgerSegmentRef(
            file=file_of_sequence_name(name, ledger_segment_file_name),
            sha256=self.sha256.hex(),
            byte_size=self.byte_size,
            record_count=self.record_count,
        )


class LedgerCompactIndex(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Version 9's index: version 8's with each segment a :class:`LedgerSegmentEntryV9`."""

    segments: list[LedgerSegmentEntryV9]
    runs: list[tuple[_NonNegativeInt, _NonNegativeInt, Annotated[int, msgspec.Meta(ge=1)]]]
    """``(position in segments, first record ordinal, count)``, in ledger order."""


class CompactSidecarState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A version 9 ``rollout_recovery.json``: version 8 with compact segment rows."""

    schema_version: int
    ledger_index: LedgerCompactIndex
    batch_shortfall: dict[str, Any]
    sampler_stamps_target_steps: bool | None
    reward_settings: CaptureRewardSettings | None


class _CompactIndexOnly(msgspec.Struct):
    ledger_index: LedgerCompactIndex


def encode_compact_sidecar(envelope: RolloutRecoveryState, index: LedgerIndex) -> bytes:
    """A version 9 sidecar: ``envelope`` with ``index`` (its groups as runs, its segments as
    compact rows), its finalizer maps left out (the caller stores them elsewhere)."""
    segments = [LedgerSegmentEntryV9.of(ref) for ref in index.segments]
    compact = LedgerCompactIndex(segments=segments, runs=keyed_runs(index.groups))
    return _encode_apart(envelope, COMPACT_SIDECAR_SCHEMA_VERSION, compact)


def decode_compact_sidecar(
    data: bytes,
    *,
    finalizer_metrics_by_group: dict[str, Any],
    finalizer_rewards_by_group: dict[str, Any],
) -> IndexedSidecarState:
    """A version 9 sidecar's bytes, strictly decoded, its rows and runs expanded, with the
    finalizer maps the caller read from where they are held (as :func:`decode_runs_sidecar`)."""
    state = _decode_versioned(data, CompactSidecarState, COMPACT_SIDECAR_SCHEMA_VERSION)
    refs = [row.ref() for row in state.ledger_index.segments]
    return _with_finalizer_maps(
        state,
        _expand(refs, state.ledger_index.runs),
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
    )


# -- version 10: the segments' rows in per-anchor catalogs ------------------------------

CATALOG_SIDECAR_SCHEMA_VERSION: Final = 10
"""The sidecar file's version when each listed segment's row is in a ledger catalog.

Version 9 repeats every referenced ledger segment's row (~60 bytes: the raw digest
is 46 of them) in every snapshot of an anchor, one more row each snapshot until
compaction drops some: ~6 KB of a ~8.8 KB sidecar at round 100 of the benchmark's
anchor (issue 16). The rows never change once their segment is written, so version 10
writes them once, into a **ledger catalog** beside the segments
(``<stem>-ledger.catalog.json``, :class:`LedgerCatalogFile`, written durably by the
snapshot that writes its segments, before that snapshot commits), and the index lists
the catalogs it uses (``[name, sha256, byte_size, entry_count]``, :class:`LedgerCatalogRef`)
and each segment by its name only (the sequence number, ~4 bytes; or the file name
as text). Decoded, it is version 9's index exactly: the rows in the index's order."""

LEDGER_CATALOG_SCHEMA_VERSION: Final = 1
SUPPORTED_LEDGER_CATALOG_SCHEMA_VERSIONS: Final = frozenset({LEDGER_CATALOG_SCHEMA_VERSION})
LEDGER_CATALOG_SUFFIX: Final = "-ledger.catalog.json"

LedgerCatalogFileName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}-ledger\.catalog\.json$")
]


def ledger_catalog_file_name(stem: str) -> str:
    """The name of the ledger catalog the snapshot named ``stem`` writes."""
    return f"{stem}{LEDGER_CATALOG_SUFFIX}"


class LedgerCatalogFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A ledger catalog's content: the rows of the segments it describes (version 9's)."""

    schema_version: int
    entries: list[LedgerSegmentEntryV9]


class LedgerCatalogRef(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A catalog a version 10 index uses: ``[name, sha256, byte_size, entry_count]``."""

    name: _NonNegativeInt | LedgerCatalogFileName
    """The sequence number when the file name is :func:`ledger_catalog_file_name` of it,
    zero-padded; else the file name as text."""
    sha256: Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
    byte_size: _NonNegativeInt
    entry_count: Annotated[int, msgspec.Meta(ge=1)]

    def __post_init__(self) -> None:
        require_sequence_number(self.name, ledger_catalog_file_name)

    @property
    def file(self) -> str:
        return file_of_sequence_name(self.name, ledger_catalog_file_name)


class _SegmentName(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """Only to check one listed segment's name as version 9's rows are checked."""

    name: _NonNegativeInt | LedgerSegmentFileName

    def __post_init__(self) -> None:
        require_sequence_number(self.name, ledger_segment_file_name)


class LedgerCatalogIndex(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Version 10's index: the catalogs used, each segment by name, the groups as runs."""

    catalogs: list[LedgerCatalogRef]
    segments: list[_NonNegativeInt | LedgerSegmentFileName]
    runs: list[tuple[_NonNegativeInt, _NonNegativeInt, Annotated[int, msgspec.Meta(ge=1)]]]
    """``(position in segments, first record ordinal, count)``, in ledger order."""


class CatalogSidecarState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A version 10 ``rollout_recovery.json``: version 9 with its rows in catalogs."""

    schema_version: int
    ledger_index: LedgerCatalogIndex
    batch_shortfall: dict[str, Any]
    sampler_stamps_target_steps: bool | None
    reward_settings: CaptureRewardSettings | None


class _CatalogIndexOnly(msgspec.Struct):
    ledger_index: LedgerCatalogIndex


_CATALOG_DECODER: Final = msgspec.json.Decoder(LedgerCatalogFile, strict=True)
_CATALOG_VERSION_DECODER: Final = msgspec.json.Decoder(_VersionOnly)


def encode_ledger_catalog(refs: list[LedgerSegmentRef]) -> bytes:
    """A ledger catalog describing ``refs`` (in that order)."""
    return msgspec.json.encode(
        LedgerCatalogFile(
            schema_version=LEDGER_CATALOG_SCHEMA_VERSION,
            entries=[LedgerSegmentEntryV9.of(ref) for ref in refs],
        )
    )


def decode_ledger_catalog(data: bytes, *, file: str, entry_count: int) -> list[LedgerSegmentRef]:
    """The rows of the catalog ``file`` (its bytes already checked against the index's
    SHA-256 and size), checked: its version, its schema, ``entry_count`` entries, none twice.
    Raises :class:`LedgerStateError` naming the catalog and the field."""
    where = f"ledger catalog {file}"
    try:
        catalog = _CATALOG_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        _require_catalog_version(data, where)
        raise LedgerStateError(f"{where}: {exc}") from exc
    _require_catalog_version(data, where)
    if len(catalog.entries) != entry_count:
        raise LedgerStateError(
            f"{where}: holds {len(catalog.entries)} entries, the sidecar records {entry_count}"
        )
    refs = [entry.ref() for entry in catalog.entries]
    first: dict[str, int] = {}
    for position, ref in enumerate(refs):
        if first.setdefault(ref.file, position) != position:
            raise LedgerStateError(
                f"{where}: $.entries[{position}][0] (name): segment {ref.file!r} described "
                f"twice (first at entries[{first[ref.file]}])"
            )
    return refs


def _require_catalog_version(data: bytes, where: str) -> None:
    """Refuse ``data`` unless its ``schema_version`` is one this build reads (any other
    problem is left to the caller)."""
    try:
        version = _CATALOG_VERSION_DECODER.decode(data).schema_version
    except (msgspec.ValidationError, msgspec.DecodeError):
        return
    if version not in SUPPORTED_LEDGER_CATALOG_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, sorted(SUPPORTED_LEDGER_CATALOG_SCHEMA_VERSIONS)))
        raise LedgerStateError(
            f"{where}: $.schema_version: {version}; this build reads catalog versions {readable}"
        )


def encode_catalog_sidecar(
    envelope: RolloutRecoveryState,
    index: LedgerIndex,
    catalogs: list[tuple[str, str, int, int]],
) -> bytes:
    """A version 10 sidecar: ``envelope`` with ``index``, its segments named only, their rows
    in ``catalogs`` (each ``(file, hex sha256, byte_size, entry_count)``, durable already),
    its finalizer maps left out (the caller stores them elsewhere)."""
    compact = LedgerCatalogIndex(
        catalogs=[
            LedgerCatalogRef(
                sequence_name(file, ledger_catalog_file_name), bytes.fromhex(sha), size, count
            )
            for file, sha, size, count in catalogs
        ],
        segments=[sequence_name(ref.file, ledger_segment_file_name) for ref in index.segments],
        runs=keyed_runs(index.groups),
    )
    return _encode_apart(envelope, CATALOG_SIDECAR_SCHEMA_VERSION, compact)


CatalogReader = Callable[[LedgerCatalogRef], bytes]
"""Reads a listed catalog's bytes, checked against the ref's size and SHA-256 (the snapshot
layer's I/O; this layer does none)."""


def decode_catalog_sidecar(
    data: bytes,
    *,
    finalizer_metrics_by_group: dict[str, Any],
    finalizer_rewards_by_group: dict[str, Any],
    read_catalog: CatalogReader,
) -> IndexedSidecarState:
    """A version 10 sidecar's bytes, strictly decoded, its segments' rows taken from its
    catalogs (each read with ``read_catalog``), its runs expanded, with the finalizer maps
    the caller read from where they are held (as :func:`decode_compact_sidecar`)."""
    state = _decode_versioned(data, CatalogSidecarState, CATALOG_SIDECAR_SCHEMA_VERSION)
    refs = catalog_segment_refs(state.ledger_index, read_catalog)
    return _with_finalizer_maps(
        state,
        _expand(refs, state.ledger_index.runs),
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
    )


def catalog_segment_refs(
    index: LedgerCatalogIndex, read_catalog: CatalogReader
) -> list[LedgerSegmentRef]:
    """The rows of ``index``'s segments, in its order, from its catalogs: each catalog
    listed once, each segment described by exactly one listed catalog."""
    rows: dict[str, tuple[LedgerSegmentRef, int]] = {}
    seen: dict[str, int] = {}
    for position, catalog in enumerate(index.catalogs):
        where = f"{_WHAT} $.ledger_index.catalogs[{position}]"
        if seen.setdefault(catalog.file, position) != position:
            raise LedgerStateError(
                f"{where}: catalog {catalog.file!r} listed twice (first at [{seen[catalog.file]}])"
            )
        entries = decode_ledger_catalog(
            read_catalog(catalog), file=catalog.file, entry_count=catalog.entry_count
        )
        for ref in entries:
            if ref.file in rows:
                raise LedgerStateError(
                    f"{where}: segment {ref.file!r} is described by catalogs "
                    f"[{rows[ref.file][1]}] and [{position}]"
                )
            rows[ref.file] = (ref, position)
    refs: list[LedgerSegmentRef] = []
    named: set[str] = set()
    for position, name in enumerate(index.segments):
        where = f"{_WHAT} $.ledger_index.segments[{position}]"
        try:
            _SegmentName(name)
        except ValueError as exc:
            raise LedgerStateError(f"{where}: {exc}") from exc
        file = file_of_sequence_name(name, ledger_segment_file_name)
        if file in named:
            raise LedgerStateError(f"{where}: segment {file!r} listed twice")
        named.add(file)
        found = rows.get(file)
        if found is None:
            raise LedgerStateError(f"{where}: segment {file!r} is in none of its catalogs")
        refs.append(found[0])
    return refs


def referenced_catalog_sidecar_files(data: bytes) -> set[str]:
    """The ledger segments and catalogs a version 10 sidecar lists (what retention keeps)."""
    try:
        index = msgspec.json.decode(data, type=_CatalogIndexOnly, strict=True).ledger_index
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{_WHAT} $.ledger_index: {exc}") from exc
    files = {catalog.file for catalog in index.catalogs}
    files.update(file_of_sequence_name(name, ledger_segment_file_name) for name in index.segments)
    return files
