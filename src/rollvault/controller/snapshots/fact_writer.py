"""Writing a snapshot's group facts: only those new since the last committed snapshot.

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

The index it returns is :mod:`.fact_index`'s :class:`~.fact_index.GroupFactsFile`; the
caller writes it into the snapshot.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.controller.snapshots.fact_forms import (
    Fact,
    FinalizedFact,
    OriginFact,
    ReplayFact,
    encode_fact_segment,
)
from rollvault.controller.snapshots.fact_index import (
    FACT_CATALOG_SCHEMA_VERSION,
    GROUP_FACTS_SCHEMA_VERSION,
    FactCatalogEntry,
    FactCatalogFile,
    FactSegmentRef,
    GroupFactsFile,
    fact_catalog_file_name,
    fact_segment_file_name,
    fact_segment_name_field,
)
from rollvault.controller.snapshots.fact_segments import LoadedFacts
from rollvault.controller.snapshots.write_budget import carry_after, take_within, write_budget
from rollvault.dataplane.live_ordinals import encode_live_bitmap
from rollvault.dataplane.segment_catalog import WrittenCatalog, plan_catalogs
from rollvault.durable.index_runs import consecutive_runs
from rollvault.durable.segment_store import (
    publish_catalog,
    publish_fact_segment,
)

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
    catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
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
    _catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
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

    def _catalogs_for(
        self, index: GroupFactsFile, stem: str
    ) -> tuple[dict[str, WrittenCatalog], int]:
        """The catalogs describing ``index``'s segments (each by exactly one), and the bytes of
        the new one: it describes the segments no kept catalog does (new, or a seeded
        writer's) and those of the catalogs merged past :data:`MAX_CATALOGS`; durable when
        this returns."""
        referenced = {ref.file: ref for ref in index.segments}
        plan = plan_catalogs(self._catalogs, referenced, limit=MAX_CATALOGS)
        kept = plan.kept
        if not plan.moving:
            return kept, 0
        entries = [
            FactCatalogEntry(
                fact_segment_name_field(file),
                bytes.fromhex(referenced[file].sha256),
                referenced[file].byte_size,
                referenced[file].fact_count,
            )
            for file in plan.moving
        ]
        data = msgspec.json.encode(
            FactCatalogFile(schema_version=FACT_CATALOG_SCHEMA_VERSION, entries=entries)
        )
        file = fact_catalog_file_name(stem)
        publish_catalog(self.segments_dir / file, data)
        kept[file] = WrittenCatalog(
            file, hashlib.sha256(data).hexdigest(), len(data), tuple(plan.moving)
        )
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
