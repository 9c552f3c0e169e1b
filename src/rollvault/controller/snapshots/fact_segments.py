"""The controller's per-group facts, written once per anchor into fact segments.

Two facts are set once per prompt group and never change afterwards: its
*origin* (epoch, dataset index and the identity digest of its prompt), set
at reservation, and its *finalization* (per sibling the reward after the
checks, the finalizer metrics, and the gate rollout id of each published
attempt), set when it is finalized. Snapshot files before
``controller_state.json`` version 5, ``replay_buffer_metadata.json`` version
2 and ``rollout_recovery.json`` version 7 held them in per-group maps, and
every snapshot rewrote every map whole (~450 KB at 1,024 groups, against
~600 KB of new rows per snapshot).

Now each fact is written once per anchor into a **fact segment**
(``<anchor>/rollout_snapshots/segments/<seq>-facts.facts-segment.msgpack``,
form 2 of :mod:`.fact_forms`; form 1, ``.json``, is still read; published
durably before the snapshot that references it commits), the way rows and
ledger records are, and each
snapshot holds only an index, ``group_facts.json`` (:class:`GroupFactsFile`):
the segments it references, each with its SHA-256, size and fact count, and
which of its facts are live (version 3, written: a compact row in the data
plane's ``metadata.json`` version 3 forms, :class:`FactSegmentEntryV3`; version
2, read: a bitmap over the segment's ordinals,
:func:`~rollvault.dataplane.live_ordinals.encode_live_bitmap`, and the live count).
The files that held the maps no longer do; :mod:`.snapshot_files` resolves
the index and gives restore the same maps as before. Since index version 2
the replay index's entries are facts too (a canonical group's entry is set
when it is finalized and never changes while it waits): version 3 of
``replay_buffer_metadata.json`` holds only their order
(:func:`replay_order_runs`), not ~160 bytes per waiting group every snapshot.

:class:`FactSegmentWriter` remembers, for the last snapshot it *committed*,
where each group's facts are and their values; a fact equal to the one
remembered costs a bit in a bitmap. A restore seeds it
(:class:`FactSeed`) with the facts it loaded, so the first snapshot after a
restart writes only facts new since. Facts are compared by value (identity
first): they are small, frozen, and a restored group's are equal, not the
same objects.

Bounding the disk and the index: a referenced segment fewer than
:data:`COMPACT_BELOW` of whose facts are live has its live facts rewritten
into the new segment (facts die when their group is dropped or forgotten at a
trainer checkpoint, which starts a new anchor anyway); and since within one
anchor facts rarely die, every snapshot would otherwise add a segment to
every later index. Merging segments is spread over snapshots by a **budget**,
as the ledger segments' whole rewrites are (:mod:`.ledger_segments`): past
:data:`DUE_REFERENCED` referenced segments the smallest (by their live facts'
bytes) are *due* to be merged into the new one, and a snapshot merges them,
smallest first, while they fit in :data:`MERGE_SHARE` times the bytes of its
own new facts plus what the previous snapshot left unspent while a merge
waited (:func:`merge_budget`). The hard bound forces merges whatever the
budget: a snapshot references at most :data:`MAX_REFERENCED` fact segments,
each at least :data:`COMPACT_BELOW` live, so a restore opens at most that
many and reads at most about twice its live facts' bytes. (Before, past 32
referenced segments the smallest were merged until half remained, ~80 KB in
one snapshot of the benchmark's long anchor, 1.24-1.42x its new rows.) The
budget's carry is the writer's memory only: nothing new is persisted, the
reader is unchanged.

This module is the format, the writer and the reader; it raises
:class:`FactsError` naming the file, which the snapshot layer reports as a
corrupt snapshot.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.controller.snapshots.fact_forms import (
    FACT_SEGMENT_FORMAT,
    FACT_SEGMENT_SUFFIX,
    JSON_FACT_SEGMENT_FORMAT,
    JSON_FACT_SEGMENT_SUFFIX,
    Fact,
    FactFormError,
    FinalizedFact,
    OriginFact,
    ReplayFact,
    decode_fact_segment,
    encode_fact_segment,
)
from rollvault.controller.snapshots.write_budget import carry_after, take_within, write_budget
from rollvault.dataplane.live_ordinals import (
    decode_live,
    decode_live_bitmap,
    encode_live,
    encode_live_bitmap,
)
from rollvault.dataplane.segment_catalog import catalogs_to_merge
from rollvault.durable.index_runs import (
    consecutive_runs,
    expand_number_runs,
    in_a_run,
    in_file_order,
    number_runs,
)
from rollvault.durable.segment_store import (
    RecordedSegmentError,
    file_of_sequence_name,
    publish_catalog,
    publish_fact_segment,
    read_recorded_segment,
    require_sequence_number,
    sequence_name,
)
from rollvault.ledger.reward_penalties import FinalizedReward

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
MAX_CATALOGS: Final = 16
"""Most fact catalogs one index lists (restore opens each); past it, the referenced rows of
those with the fewest move into the snapshot's new catalog (the row catalogs' rule)."""
COMPACT_BELOW: Final = 0.5
"""Rewrite a segment's live facts once fewer than this fraction of its facts are live."""
DUE_REFERENCED: Final = 96
"""Past this many referenced segments (the new one included) the smallest are due to be
merged into the new one, within the budget (:func:`merge_budget`).

96 and 128 (48 and 64 before version 4): a merge rewrites a segment's live facts (~5 KB
a segment in the benchmark's anchor, about a snapshot's new facts) to save its index
row in every later snapshot. At ~60 B a row (version 3) that paid back after ~80
snapshots; with the rows in catalogs (a few bytes a segment in the index) it never does
in bytes, so merges are only for restore, which opens each referenced segment (a small
file each: ~0.1 ms)."""
MAX_REFERENCED: Final = 128
"""Most segments an index references: past it the smallest are merged whatever the budget
(restore opens at most this many fact segments)."""
MERGE_SHARE: Final = 1.0
"""A snapshot may merge due segments of up to this many times the bytes of its new facts
(plus the carry; see :func:`merge_budget`)."""


def merge_budget(change_bytes: int, carry: int, room: int | None = None) -> int:
    """Bytes of live facts a snapshot may merge by choice: :data:`MERGE_SHARE` times the bytes
    of the facts it writes anyway (``change_bytes``), plus ``carry``, what the previous
    snapshot left unspent while a due merge waited for it; at most ``room``, the snapshot's
    headroom (:func:`~.write_budget.headroom`) left after those facts, when it is known."""
    return write_budget(MERGE_SHARE, change_bytes, carry, room)


_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_GroupId = Annotated[str, msgspec.Meta(min_length=1)]
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


@dataclass(frozen=True)
class FactCatalog:
    """A durable fact catalog: its file, SHA-256, size and the segments it describes."""

    file: str
    sha256: str
    """Hex SHA-256 of the file."""
    byte_size: int
    segments: tuple[str, ...]

    def ref(self) -> FactCatalogRef:
        return FactCatalogRef(
            sequence_name(self.file, fact_catalog_file_name),
            bytes.fromhex(self.sha256),
            self.byte_size,
            len(self.segments),
        )


class _GroupFactsFileV3(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json`` version 3 as it is on disk: each segment a compact row."""

    schema_version: int
    segments: list[FactSegmentEntryV3]


def _entry_v3(ref: FactSegmentRef) -> FactSegmentEntryV3:
    """``ref`` as a version 3 row (its bitmap was checked when the writer built it)."""
    bits = decode_live_bitmap(ref.live, ref.fact_count, ref.live_facts)
    held = [ordinal for ordinal, live in enumerate(bits) if live]
    return FactSegmentEntryV3(
        name=_name_field(ref.file),
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
        file=_file_of(entry.name),
        sha256=entry.sha256.hex(),
        byte_size=entry.byte_size,
        fact_count=entry.fact_count,
        live_facts=len(held),
        live=encode_live_bitmap(entry.fact_count, held),
    )


def _name_field(file: str) -> int | str:
    """Version 3's ``name`` of ``file``: the sequence number when the name is this writer's
    for a zero-padded one, else the name itself (a form 1 segment, another writer's)."""
    return sequence_name(file, fact_segment_file_name)


def _file_of(name: int | str) -> str:
    """The file name version 3's ``name`` stands for (see :func:`_name_field`)."""
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


# -- writing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Held:
    value: object
    """What the fact was written from: (origin, identity), a FinalizedGroup or a ReplayEntry."""
    file: str
    ordinal: int


@dataclass(frozen=True)
class _SegmentInfo:
    sha256: str
    byte_size: int
    fact_count: int


@dataclass(frozen=True)
class FactWriteInfo:
    """What one :meth:`FactSegmentWriter.write` did."""

    segment_bytes: int
    new_facts: int
    """Facts written: new or changed ones, and the compacted or merged ones."""
    compacted_facts: int
    """Of ``new_facts``, unchanged facts rewritten to leave a sparse or small segment."""
    referenced: tuple[str, ...]
    budget: int = 0
    """Bytes of live facts this snapshot could merge by choice (:func:`merge_budget`)."""
    merged_bytes: int = 0
    """Estimated bytes of the due segments' live facts it merged by choice: at most ``budget``."""
    forced_segments: int = 0
    """Segments merged past :data:`MAX_REFERENCED`, outside the budget."""
    waiting_segments: int = 0
    """Due segments left for a later snapshot's budget."""
    catalog_bytes: int = 0
    """Bytes of the fact catalog this snapshot wrote (0: none)."""


@dataclass
class PendingFacts:
    """A written index the writer adopts as its base once its snapshot is committed."""

    index: GroupFactsFile
    origins: dict[str, _Held]
    finalized: dict[str, _Held]
    segments: dict[str, _SegmentInfo]
    info: FactWriteInfo
    replay: dict[str, _Held] = field(default_factory=dict)
    replay_order: list[tuple[int, int]] = field(default_factory=list)
    """The replay entries' order as runs over the index's live replay facts
    (:func:`replay_order_runs`), for ``replay_buffer_metadata.json``."""
    carry: int = 0
    """The merge budget this snapshot left unspent, for the next one (:func:`merge_budget`)."""
    catalogs: dict[str, FactCatalog] = field(default_factory=dict)
    """The catalogs describing the index's segments (``group_facts.json`` lists them)."""
    later_bytes: int | None = None
    """What its snapshot wrote after the facts were chosen (the caller sets it once the
    snapshot is written): the next snapshot's estimate of its own (``estimated`` of
    :func:`~.write_budget.headroom`)."""


@dataclass(frozen=True)
class _Wanted:
    """The facts a snapshot holds, by group: origins (with identities), finalizations and
    replay entries."""

    origins: Mapping[str, tuple[GroupOrigin, str | None]]
    finalized: Mapping[str, FinalizedGroup]
    replay: Mapping[str, ReplayEntry]


@dataclass
class _Placement:
    """Where a snapshot's facts are: the held ones, and those its new segment holds."""

    origins: dict[str, _Held]
    finalized: dict[str, _Held]
    replay: dict[str, _Held]
    facts: list[Fact]
    """The new segment's facts, in ordinal order."""
    moved: int
    """Of ``facts``, unchanged ones rewritten to leave a sparse or merged segment."""

    def placed(self) -> tuple[_Held, ...]:
        return (*self.origins.values(), *self.finalized.values(), *self.replay.values())


@dataclass(frozen=True)
class _MergePlan:
    sparse: set[str]
    forced: set[str]
    """Rewritten whatever the budget: the sparse segments and those past the hard bound."""
    due: list[tuple[int, str]]
    """``(estimated live bytes, file)`` due a merge, smallest first."""


@dataclass
class FactSegmentWriter:
    """Writes the group facts of successive snapshots into ``segments_dir`` (one per dir)."""

    segments_dir: Path
    last_written: PendingFacts | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _origins: dict[str, _Held] = field(default_factory=dict)
    _finalized: dict[str, _Held] = field(default_factory=dict)
    _replay: dict[str, _Held] = field(default_factory=dict)
    _segments: dict[str, _SegmentInfo] = field(default_factory=dict)
    _carry: int = 0
    _catalogs: dict[str, FactCatalog] = field(default_factory=dict)
    """The catalogs the last committed snapshot lists."""
    later_bytes: int | None = None
    """:attr:`PendingFacts.later_bytes` of the last committed snapshot (``None``: unknown)."""

    def write(
        self,
        origins: Mapping[str, GroupOrigin],
        identities: Mapping[str, str],
        finalized: Mapping[str, FinalizedGroup],
        *,
        stem: str,
        replay: Sequence[ReplayEntry] = (),
        room: int | None = None,
    ) -> PendingFacts:
        """Write the facts of ``origins`` (with ``identities``), ``finalized`` and ``replay``
        (the replay index's entries, in its order) not yet held.

        ``room`` is the snapshot's headroom (:func:`~.write_budget.headroom`): the new
        facts take their bytes of it first, and merges by choice fit in the rest (``None``:
        no cap but the budget's).

        The new segment, named after ``stem``, is durable when this returns;
        the index is returned, not written. Call :meth:`committed` once the
        snapshot that holds the index is.
        """
        origin_values = {g: (o, identities.get(g)) for g, o in origins.items()}
        replay_values = {entry.group_id: entry for entry in replay}
        if len(replay_values) != len(replay):
            raise ValueError("a group is in the replay entries twice")
        wanted = _Wanted(origin_values, finalized, replay_values)
        file = fact_segment_file_name(stem)
        plan = self._plan_merges(wanted)
        # The budget is the bytes of the facts written anyway (changed or new, none moved).
        changes = self._placement(wanted, set(), file)
        changes_data = encode_fact_segment(changes.facts) if changes.facts else b""
        budget = merge_budget(
            len(changes_data), self._carry, None if room is None else room - len(changes_data)
        )
        chosen, spent = take_within(budget, plan.due)  # smallest first
        waiting = len(plan.due) - len(chosen)
        moving = plan.forced | set(chosen)
        placement = changes if not moving else self._placement(wanted, moving, file)
        facts = placement.facts
        placed = placement.placed()
        segments = {held.file: self._segments[held.file] for held in placed if held.file != file}
        segment_bytes = 0
        if facts:
            # Without a merge the segment is the changes, already encoded for the budget.
            data = changes_data if placement is changes else encode_fact_segment(facts)
            publish_fact_segment(self.segments_dir / file, data)
            segments[file] = _SegmentInfo(hashlib.sha256(data).hexdigest(), len(data), len(facts))
            segment_bytes = len(data)
        index = _index(segments, placed)
        catalogs, catalog_bytes = self._catalogs_for(index, stem)
        info = FactWriteInfo(
            segment_bytes=segment_bytes,
            new_facts=len(facts),
            compacted_facts=placement.moved,
            referenced=tuple(ref.file for ref in index.segments),
            budget=budget,
            merged_bytes=spent,
            forced_segments=len(plan.forced - plan.sparse),
            waiting_segments=waiting,
            catalog_bytes=catalog_bytes,
        )
        order = replay_order_runs([placement.replay[entry.group_id] for entry in replay])
        self.last_written = PendingFacts(
            index,
            placement.origins,
            placement.finalized,
            segments,
            info,
            placement.replay,
            order,
            carry=carry_after(budget, spent, waiting=waiting > 0),
            catalogs=catalogs,
        )
        return self.last_written

    def _catalogs_for(self, index: GroupFactsFile, stem: str) -> tuple[dict[str, FactCatalog], int]:
        """The catalogs describing ``index``'s segments (each by exactly one), and the bytes of
        the new one: it describes the segments no kept catalog does (new, or a seeded
        writer's) and those of the catalogs merged past :data:`MAX_CATALOGS`; durable when
        this returns."""
        catalog_of = {
            segment: catalog.file
            for catalog in self._catalogs.values()
            for segment in catalog.segments
        }
        referenced = {ref.file: ref for ref in index.segments}
        live = Counter(catalog_of[file] for file in referenced if file in catalog_of)
        uncatalogued = [file for file in referenced if file not in catalog_of]
        merging = set(catalogs_to_merge(live, adding=bool(uncatalogued), limit=MAX_CATALOGS))
        kept = {file: self._catalogs[file] for file in live if file not in merging}
        moving = sorted(
            file for file in referenced if file not in catalog_of or catalog_of[file] in merging
        )
        if not moving:
            return kept, 0
        entries = [
            FactCatalogEntry(
                _name_field(file),
                bytes.fromhex(referenced[file].sha256),
                referenced[file].byte_size,
                referenced[file].fact_count,
            )
            for file in moving
        ]
        data = msgspec.json.encode(
            FactCatalogFile(schema_version=FACT_CATALOG_SCHEMA_VERSION, entries=entries)
        )
        file = fact_catalog_file_name(stem)
        publish_catalog(self.segments_dir / file, data)
        kept[file] = FactCatalog(file, hashlib.sha256(data).hexdigest(), len(data), tuple(moving))
        return kept, len(data)

    def _placement(self, wanted: _Wanted, moving: set[str], file: str) -> _Placement:
        """Where each wanted fact is if the live facts of ``moving`` are rewritten: the held
        ones as they are, the rest (new, changed or moved) written into ``file``."""
        origins, new_origins, moved = self._place(self._origins, wanted.origins, moving)
        finals, new_finals, moved_finals = self._place(self._finalized, wanted.finalized, moving)
        replay, new_replay, moved_replay = self._place(self._replay, wanted.replay, moving)
        facts: list[Fact] = []
        for group_id in sorted(new_origins):  # sorted: equal states give equal bytes
            origin, identity = wanted.origins[group_id]
            origins[group_id] = _Held((origin, identity), file, len(facts))
            facts.append(OriginFact(group_id, origin.epoch, origin.dataset_idx, identity))
        for group_id in sorted(new_finals):
            group = wanted.finalized[group_id]
            _check_writable(group_id, group)
            finals[group_id] = _Held(group, file, len(facts))
            facts.append(
                FinalizedFact(
                    group_id,
                    list(group.rewards),
                    group.metrics_dict(),
                    list(group.gate_rollout_ids),
                )
            )
        for group_id in new_replay:  # in the index's order: its order costs one run
            entry = wanted.replay[group_id]
            replay[group_id] = _Held(entry, file, len(facts))
            facts.append(ReplayFact.of(entry))
        return _Placement(origins, finals, replay, facts, moved + moved_finals + moved_replay)

    @staticmethod
    def _place(
        held: Mapping[str, _Held], wanted: Mapping[str, object], moving: set[str]
    ) -> tuple[dict[str, _Held], list[str], int]:
        """The held facts still wanted as they are; the groups to write; how many of those
        are unchanged but in a segment being compacted or merged."""
        placed: dict[str, _Held] = {}
        new: list[str] = []
        moved = 0
        for group_id, value in wanted.items():
            known = held.get(group_id)
            if known is not None and (known.value is value or known.value == value):
                if known.file not in moving:
                    # The current value: the next comparison is by identity.
                    placed[group_id] = _Held(value, known.file, known.ordinal)
                    continue
                moved += 1
            new.append(group_id)
        return placed, new, moved

    def _plan_merges(self, wanted: _Wanted) -> _MergePlan:
        """Which referenced segments have their live facts rewritten into the new one: the
        sparse ones and, past :data:`MAX_REFERENCED`, the smallest (forced); and which are
        due past :data:`DUE_REFERENCED` (smallest first, for the budget to choose from)."""
        live: Counter[str] = Counter()
        for held, groups in (
            (self._origins, wanted.origins),
            (self._finalized, wanted.finalized),
            (self._replay, wanted.replay),
        ):
            for group_id in groups:
                known = held.get(group_id)
                if known is not None:
                    live[known.file] += 1
        sparse = {
            file
            for file, count in live.items()
            if count < COMPACT_BELOW * self._segments[file].fact_count
        }
        # Smallest first by the bytes a merge would rewrite (the file name breaks ties, so
        # equal states plan alike).
        kept = sorted(
            (self._live_bytes(file, count), file)
            for file, count in live.items()
            if file not in sparse
        )
        # The new segment counts: after this write at most MAX_REFERENCED are referenced.
        forced_count = max(0, len(kept) + 1 - MAX_REFERENCED)
        forced = {file for _bytes, file in kept[:forced_count]}
        kept = kept[forced_count:]
        due = kept[: max(0, len(kept) + 1 - DUE_REFERENCED)]
        return _MergePlan(sparse=sparse, forced=sparse | forced, due=due)

    def _live_bytes(self, file: str, live: int) -> int:
        """The estimated bytes of ``live`` of ``file``'s facts (its bytes pro rata)."""
        segment = self._segments[file]
        return -(-segment.byte_size * live // segment.fact_count)

    def committed(self, pending: PendingFacts) -> None:
        """Make ``pending`` the base of the next snapshot: it is committed now."""
        self._origins = pending.origins
        self._finalized = pending.finalized
        self._replay = pending.replay
        self._segments = pending.segments
        self._carry = pending.carry
        self._catalogs = pending.catalogs
        self.later_bytes = pending.later_bytes
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Fact segment and catalog files the last committed snapshot references."""
        return set(self._segments) | set(self._catalogs)


def replay_order_runs(held: Sequence[_Held]) -> list[tuple[int, int]]:
    """Where each replay entry (in the index's order) is among the live replay facts, as
    the reader enumerates them (segments by file name, then ordinal): runs of
    ``(first position, count)`` of consecutive positions. Facts written in the
    index's order make one run per segment, not one number per entry."""
    positions = {
        (fact.file, fact.ordinal): n
        for n, fact in enumerate(sorted(held, key=lambda fact: (fact.file, fact.ordinal)))
    }
    return consecutive_runs(positions[(fact.file, fact.ordinal)] for fact in held)


def _check_writable(group_id: str, group: FinalizedGroup) -> None:
    """A finalization with a non-finite number (which form 1, JSON, cannot hold; kept
    refused) or as many rewards as attempts not would make an unreadable segment."""
    numbers = [value for _name, value in group.metrics]
    numbers += [n for reward in group.rewards for n in (reward.raw_reward, reward.reward)]
    if not all(map(_finite, numbers)):
        raise ValueError(f"group {group_id!r}: a finalizer reward or metric is not finite")
    if len(group.rewards) != len(group.gate_rollout_ids):
        raise ValueError(
            f"group {group_id!r}: {len(group.rewards)} rewards for "
            f"{len(group.gate_rollout_ids)} gate rollout ids"
        )


def _finite(number: float) -> bool:
    return number - number == 0.0


def _index(segments: Mapping[str, _SegmentInfo], placed: Iterable[_Held]) -> GroupFactsFile:
    held: dict[str, list[int]] = {}
    for fact in placed:
        held.setdefault(fact.file, []).append(fact.ordinal)
    return GroupFactsFile(
        schema_version=GROUP_FACTS_SCHEMA_VERSION,
        segments=[
            FactSegmentRef(
                file=file,
                sha256=segments[file].sha256,
                byte_size=segments[file].byte_size,
                fact_count=segments[file].fact_count,
                live_facts=len(held[file]),
                live=encode_live_bitmap(segments[file].fact_count, held[file]),
            )
            for file in sorted(held)
        ],
    )


# -- reading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedFacts:
    """A snapshot's live facts, checked, and where each is (to seed the next writer)."""

    index: GroupFactsFile
    origins: dict[str, GroupOrigin]
    prompt_identities: dict[str, str]
    finalized: dict[str, FinalizedGroup]
    origin_at: dict[str, tuple[str, int]]
    finalized_at: dict[str, tuple[str, int]]
    replay: list[ReplayEntry] = field(default_factory=list)
    """The live replay entries in the order the reader meets them (segments by file name,
    then ordinal): ``replay_buffer_metadata.json`` version 3 orders them."""
    replay_at: dict[str, tuple[str, int]] = field(default_factory=dict)

    def canonical_attempts(self) -> dict[str, list[str]]:
        """Per finalized group, the gate rollout id of each sibling's published attempt."""
        return {g: list(f.gate_rollout_ids) for g, f in self.finalized.items()}

    def rewards(self) -> dict[str, list[FinalizedReward]]:
        """Per finalized group, each sibling's reward after the checks and penalties."""
        return {g: list(f.rewards) for g, f in self.finalized.items()}

    def metrics(self) -> dict[str, dict[str, float]]:
        """Per finalized group, the finalizer metrics."""
        return {g: f.metrics_dict() for g, f in self.finalized.items()}


def encode_group_facts_file(
    index: GroupFactsFile, catalogs: Mapping[str, FactCatalog] | None = None
) -> bytes:
    """The bytes of ``group_facts.json`` for ``index``: version 4, its segments' rows in
    ``catalogs`` (durable already: :attr:`PendingFacts.catalogs`); without catalogs version
    3, each segment a compact row (what was written before catalogs: tests of reading it)."""
    entries = [_entry_v3(ref) for ref in index.segments]
    if catalogs is None:
        return _INDEX_ENCODER.encode(_GroupFactsFileV3(schema_version=3, segments=entries))
    held = [FactHeldEntry(entry.name, entry.live) for entry in entries]
    numbers = sorted(
        entry.name for entry in held if in_a_run(entry) and isinstance(entry.name, int)
    )
    on_disk = _GroupFactsFileV5(
        schema_version=GROUP_FACTS_SCHEMA_VERSION,
        catalogs=[catalogs[file].ref() for file in sorted(catalogs)],
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
    whole = [(_file_of(n), (f"$.whole (segment {n})", FactHeldEntry(n, []))) for n in numbers]
    others = [
        (_file_of(entry.name), entry, (f"$.segments[{position}]", entry))
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
        file = _file_of(entry.name)
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
            file = _file_of(entry.name)
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


def read_fact_segment(path: Path, ref: FactSegmentRef) -> list[Fact]:
    """The facts of the segment ``path``, refused unless it is what ``ref`` records.

    Its form is its name's: ``*.facts-segment.json`` form 1, ``*.msgpack`` form 2.
    """
    try:
        data = read_recorded_segment(
            path,
            what="fact segment",
            byte_size=ref.byte_size,
            sha256=ref.sha256,
            recorded_in=GROUP_FACTS_FILENAME,
        )
    except RecordedSegmentError as exc:
        raise FactsError(exc.path, exc.problem) from exc
    form = (
        JSON_FACT_SEGMENT_FORMAT
        if path.name.endswith(JSON_FACT_SEGMENT_SUFFIX)
        else FACT_SEGMENT_FORMAT
    )
    try:
        facts = decode_fact_segment(data, form=form)
    except FactFormError as exc:
        raise FactsError(path, str(exc)) from exc
    if len(facts) != ref.fact_count:
        raise FactsError(
            path,
            f"holds {len(facts)} facts, {GROUP_FACTS_FILENAME} records {ref.fact_count}",
        )
    return facts


def read_group_facts(path: Path, data: bytes, segments_dir: Path) -> LoadedFacts:
    """The live facts the index ``path`` (whose checked bytes are ``data``) references.

    Every referenced segment in ``segments_dir`` is read and checked whole;
    a group's origin, finalization or replay entry live twice is refused. Raises
    :class:`FactsError` naming the index or the segment.
    """
    index = decode_group_facts_file(path, data, segments_dir)
    origins: dict[str, GroupOrigin] = {}
    identities: dict[str, str] = {}
    finalized: dict[str, FinalizedGroup] = {}
    replay: list[ReplayEntry] = []
    where: dict[type, dict[str, tuple[str, int]]] = {
        OriginFact: {},
        FinalizedFact: {},
        ReplayFact: {},
    }
    for position, ref in enumerate(index.segments):
        try:
            wanted = decode_live_bitmap(
                ref.live, ref.fact_count, ref.live_facts, noun="fact", live_field="live_facts"
            )
        except ValueError as exc:
            raise FactsError(path, f"$.segments[{position}].live: {exc}") from exc
        segment_path = segments_dir / ref.file
        facts = read_fact_segment(segment_path, ref)
        for ordinal, fact in enumerate(facts):
            if not wanted[ordinal]:
                continue
            group_id = fact.group_id
            at = where[type(fact)]
            if group_id in at:
                raise FactsError(
                    segment_path,
                    f"fact {ordinal}: group {group_id!r}'s {type(fact).__name__} is also live "
                    f"in {at[group_id][0]!r}",
                )
            at[group_id] = (ref.file, ordinal)
            if isinstance(fact, OriginFact):
                origins[group_id] = GroupOrigin(epoch=fact.epoch, dataset_idx=fact.dataset_idx)
                if fact.prompt_identity is not None:
                    identities[group_id] = fact.prompt_identity
            elif isinstance(fact, FinalizedFact):
                finalized[group_id] = FinalizedGroup.of(
                    rewards=fact.rewards,
                    metrics=fact.metrics,
                    gate_rollout_ids=fact.gate_rollout_ids,
                )
            else:
                replay.append(fact.entry())
    return LoadedFacts(
        index,
        origins,
        identities,
        finalized,
        where[OriginFact],
        where[FinalizedFact],
        replay,
        where[ReplayFact],
    )


def replay_in_order(
    path: Path, facts: LoadedFacts, runs: Sequence[tuple[int, int]]
) -> list[ReplayEntry]:
    """The live replay entries of ``facts`` in the order ``runs`` (from ``path``, a
    ``replay_buffer_metadata.json`` of version 3) gives them: every live entry exactly once.

    Raises :class:`FactsError` naming ``path``.
    """
    positions = [start + n for start, count in runs for n in range(count)]
    if sorted(positions) != list(range(len(facts.replay))):
        raise FactsError(
            path,
            f"$.order: runs over {len(positions)} positions are not each of the "
            f"{len(facts.replay)} live replay entries in {GROUP_FACTS_FILENAME} once",
        )
    return [facts.replay[position] for position in positions]


def referenced_fact_segments(path: Path, data: bytes) -> set[str]:
    """The fact segment files the index ``path`` (bytes ``data``) lists, and from version 4
    its catalogs (what retention keeps; no catalog is read)."""
    try:
        version = msgspec.json.decode(data, type=_Versioned, strict=True).schema_version
        if version in (4, 5):
            catalogs, held = _held_v4(path, data, version)
            files = {catalog.file for catalog in catalogs}
            return files | {_file_of(entry.name) for _where, entry in held}
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise FactsError(path, str(exc)) from exc
    return {ref.file for ref in decode_group_facts_file(path, data).segments}


@dataclass(frozen=True)
class FactSeed:
    """A restored snapshot's facts and where they are, to seed the next snapshot's writer."""

    segments_dir: Path
    loaded: LoadedFacts

    def writer(self) -> FactSegmentWriter:
        """A writer whose next snapshot writes only facts new since the restored one."""
        loaded = self.loaded
        writer = FactSegmentWriter(self.segments_dir)
        writer._origins = {
            group_id: _Held((origin, loaded.prompt_identities.get(group_id)), *at)
            for group_id, origin in loaded.origins.items()
            for at in (loaded.origin_at[group_id],)
        }
        writer._finalized = {
            group_id: _Held(group, *loaded.finalized_at[group_id])
            for group_id, group in loaded.finalized.items()
        }
        writer._replay = {
            entry.group_id: _Held(entry, *loaded.replay_at[entry.group_id])
            for entry in loaded.replay
        }
        writer._segments = {
            ref.file: _SegmentInfo(ref.sha256, ref.byte_size, ref.fact_count)
            for ref in loaded.index.segments
        }
        return writer
