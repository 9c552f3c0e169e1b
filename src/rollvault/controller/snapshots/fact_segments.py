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
(``<anchor>/rollout_snapshots/segments/<seq>-facts.facts-segment.json``,
strict JSON of :class:`FactSegment`, published durably before the snapshot
that references it commits), the way rows and ledger records are, and each
snapshot holds only an index, ``group_facts.json`` (:class:`GroupFactsFile`):
the segments it references, each with its SHA-256, size and fact count, and
which of its facts are live, as a bitmap over the segment's ordinals (the
data plane's form, :func:`~rollvault.dataplane.segmented.encode_live_bitmap`).
The files that held the maps no longer do; :mod:`.snapshot_files` resolves
the index and gives restore the same maps as before.

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
every later index: beyond :data:`MAX_REFERENCED` referenced segments the
smallest are merged into the new one until half remain, so each fact is
rewritten a few times at most, not at every snapshot.

This module is the format, the writer and the reader; it raises
:class:`FactsError` naming the file, which the snapshot layer reports as a
corrupt snapshot.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.dataplane.segmented import decode_live_bitmap, encode_live_bitmap
from rollvault.durable.segment_store import (
    RecordedSegmentError,
    publish_fact_segment,
    read_recorded_segment,
)
from rollvault.ledger.reward_penalties import FinalizedReward

GROUP_FACTS_FILENAME: Final = "group_facts.json"
"""The snapshot's index of its fact segments (advertised like every sidecar)."""
GROUP_FACTS_SCHEMA_VERSION: Final = 1
FACT_SEGMENT_FORMAT: Final = 1
FACT_SEGMENT_SUFFIX: Final = ".facts-segment.json"
COMPACT_BELOW: Final = 0.5
"""Rewrite a segment's live facts once fewer than this fraction of its facts are live."""
MAX_REFERENCED: Final = 32
"""Most segments an index references before the smallest are merged into the new one."""

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_GroupId = Annotated[str, msgspec.Meta(min_length=1)]
FactSegmentFileName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.facts-segment\.json$")
]
_ENCODER: Final = msgspec.json.Encoder(order="sorted")


class FactsError(Exception):
    """A group-facts index or fact segment is missing, damaged or inconsistent."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class OriginFact(
    msgspec.Struct, tag="origin", tag_field="kind", forbid_unknown_fields=True, frozen=True
):
    """A group's origin, written when it is reserved."""

    group_id: _GroupId
    epoch: int
    dataset_idx: int
    prompt_identity: str | None
    """The dataset's identity digest of its prompt (None: not recorded)."""


class FinalizedFact(
    msgspec.Struct, tag="finalized", tag_field="kind", forbid_unknown_fields=True, frozen=True
):
    """What the finalizer recorded about a canonical group, written when it is finalized."""

    group_id: _GroupId
    rewards: list[FinalizedReward]
    metrics: dict[str, float]
    gate_rollout_ids: list[str]


Fact = OriginFact | FinalizedFact


class FactSegment(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One fact segment: the facts one snapshot wrote, in ordinal order."""

    fact_segment_format: int
    facts: list[Fact]


class FactSegmentRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One fact segment a snapshot references, and which of its facts are live."""

    file: FactSegmentFileName
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    byte_size: _NonNegativeInt
    fact_count: Annotated[int, msgspec.Meta(ge=1)]
    live_facts: _NonNegativeInt
    live: str
    """Base64 of the bitmap of live ordinals (little-endian bit order)."""


class GroupFactsFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``group_facts.json``: the fact segments a snapshot references."""

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
    """What the fact was written from: (origin, identity) or a FinalizedGroup."""
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


@dataclass
class PendingFacts:
    """A written index the writer adopts as its base once its snapshot is committed."""

    index: GroupFactsFile
    origins: dict[str, _Held]
    finalized: dict[str, _Held]
    segments: dict[str, _SegmentInfo]
    info: FactWriteInfo


@dataclass
class FactSegmentWriter:
    """Writes the group facts of successive snapshots into ``segments_dir`` (one per dir)."""

    segments_dir: Path
    last_written: PendingFacts | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _origins: dict[str, _Held] = field(default_factory=dict)
    _finalized: dict[str, _Held] = field(default_factory=dict)
    _segments: dict[str, _SegmentInfo] = field(default_factory=dict)

    def write(
        self,
        origins: Mapping[str, GroupOrigin],
        identities: Mapping[str, str],
        finalized: Mapping[str, FinalizedGroup],
        *,
        stem: str,
    ) -> PendingFacts:
        """Write the facts of ``origins`` (with ``identities``) and ``finalized`` not yet held.

        The new segment, named after ``stem``, is durable when this returns;
        the index is returned, not written. Call :meth:`committed` once the
        snapshot that holds the index is.
        """
        origin_values = {g: (o, identities.get(g)) for g, o in origins.items()}
        moving = self._moving(origin_values.keys(), finalized.keys())
        file = fact_segment_file_name(stem)
        placed_origins, new_origins, moved = self._place(self._origins, origin_values, moving)
        placed_finals, new_finals, moved_finals = self._place(self._finalized, finalized, moving)
        facts: list[Fact] = []
        for group_id in sorted(new_origins):  # sorted: equal states give equal bytes
            origin, identity = origin_values[group_id]
            placed_origins[group_id] = _Held((origin, identity), file, len(facts))
            facts.append(OriginFact(group_id, origin.epoch, origin.dataset_idx, identity))
        for group_id in sorted(new_finals):
            group = finalized[group_id]
            _check_finite(group_id, group)
            placed_finals[group_id] = _Held(group, file, len(facts))
            facts.append(
                FinalizedFact(
                    group_id,
                    list(group.rewards),
                    group.metrics_dict(),
                    list(group.gate_rollout_ids),
                )
            )
        segments = {
            held.file: self._segments[held.file]
            for held in (*placed_origins.values(), *placed_finals.values())
            if held.file != file
        }
        segment_bytes = 0
        if facts:
            data = _ENCODER.encode(
                FactSegment(fact_segment_format=FACT_SEGMENT_FORMAT, facts=facts)
            )
            publish_fact_segment(self.segments_dir / file, data)
            segments[file] = _SegmentInfo(hashlib.sha256(data).hexdigest(), len(data), len(facts))
            segment_bytes = len(data)
        index = _index(segments, (*placed_origins.values(), *placed_finals.values()))
        info = FactWriteInfo(
            segment_bytes=segment_bytes,
            new_facts=len(facts),
            compacted_facts=moved + moved_finals,
            referenced=tuple(ref.file for ref in index.segments),
        )
        self.last_written = PendingFacts(index, placed_origins, placed_finals, segments, info)
        return self.last_written

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

    def _moving(self, origins: Iterable[str], finalized: Iterable[str]) -> set[str]:
        """Referenced segments whose live facts are rewritten into the new one: the sparse
        ones, and the smallest while more than :data:`MAX_REFERENCED` are referenced."""
        live: Counter[str] = Counter()
        for held, groups in ((self._origins, origins), (self._finalized, finalized)):
            for group_id in groups:
                known = held.get(group_id)
                if known is not None:
                    live[known.file] += 1
        moving = {
            file
            for file, count in live.items()
            if count < COMPACT_BELOW * self._segments[file].fact_count
        }
        kept = sorted((count, file) for file, count in live.items() if file not in moving)
        if len(kept) > MAX_REFERENCED:
            moving |= {file for _count, file in kept[: len(kept) - MAX_REFERENCED // 2]}
        return moving

    def committed(self, pending: PendingFacts) -> None:
        """Make ``pending`` the base of the next snapshot: it is committed now."""
        self._origins = pending.origins
        self._finalized = pending.finalized
        self._segments = pending.segments
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Fact segment files the last committed snapshot references."""
        return set(self._segments)


def _check_finite(group_id: str, group: FinalizedGroup) -> None:
    """JSON has no NaN or infinity: such a value would make the segment unreadable."""
    numbers = [value for _name, value in group.metrics]
    numbers += [n for reward in group.rewards for n in (reward.raw_reward, reward.reward)]
    if not all(map(_finite, numbers)):
        raise ValueError(f"group {group_id!r}: a finalizer reward or metric is not finite")


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

    def canonical_attempts(self) -> dict[str, list[str]]:
        """Per finalized group, the gate rollout id of each sibling's published attempt."""
        return {g: list(f.gate_rollout_ids) for g, f in self.finalized.items()}

    def rewards(self) -> dict[str, list[FinalizedReward]]:
        """Per finalized group, each sibling's reward after the checks and penalties."""
        return {g: list(f.rewards) for g, f in self.finalized.items()}

    def metrics(self) -> dict[str, dict[str, float]]:
        """Per finalized group, the finalizer metrics."""
        return {g: f.metrics_dict() for g, f in self.finalized.items()}


def decode_group_facts_file(path: Path, data: bytes) -> GroupFactsFile:
    """``group_facts.json``'s bytes, strictly decoded and checked (no segment is read)."""
    try:
        index = msgspec.json.decode(data, type=GroupFactsFile, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FactsError(path, str(exc)) from exc
    if index.schema_version != GROUP_FACTS_SCHEMA_VERSION:
        raise FactsError(
            path,
            f"unsupported schema_version {index.schema_version} "
            f"(supported: {GROUP_FACTS_SCHEMA_VERSION})",
        )
    seen: set[str] = set()
    for position, ref in enumerate(index.segments):
        if ref.file in seen:
            raise FactsError(path, f"$.segments[{position}].file: {ref.file!r} listed twice")
        seen.add(ref.file)
    return index


def read_fact_segment(path: Path, ref: FactSegmentRef) -> list[Fact]:
    """The facts of the segment ``path``, refused unless it is what ``ref`` records."""
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
    try:
        segment = msgspec.json.decode(data, type=FactSegment, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FactsError(path, str(exc)) from exc
    if segment.fact_segment_format != FACT_SEGMENT_FORMAT:
        raise FactsError(
            path,
            f"unsupported fact_segment_format {segment.fact_segment_format} "
            f"(supported: {FACT_SEGMENT_FORMAT})",
        )
    if len(segment.facts) != ref.fact_count:
        raise FactsError(
            path,
            f"holds {len(segment.facts)} facts, {GROUP_FACTS_FILENAME} records {ref.fact_count}",
        )
    return segment.facts


def read_group_facts(path: Path, data: bytes, segments_dir: Path) -> LoadedFacts:
    """The live facts the index ``path`` (whose checked bytes are ``data``) references.

    Every referenced segment in ``segments_dir`` is read and checked whole;
    a group's origin or finalization live twice is refused. Raises
    :class:`FactsError` naming the index or the segment.
    """
    index = decode_group_facts_file(path, data)
    origins: dict[str, GroupOrigin] = {}
    identities: dict[str, str] = {}
    finalized: dict[str, FinalizedGroup] = {}
    origin_at: dict[str, tuple[str, int]] = {}
    finalized_at: dict[str, tuple[str, int]] = {}
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
            at = origin_at if isinstance(fact, OriginFact) else finalized_at
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
            else:
                finalized[group_id] = FinalizedGroup.of(
                    rewards=fact.rewards,
                    metrics=fact.metrics,
                    gate_rollout_ids=fact.gate_rollout_ids,
                )
    return LoadedFacts(index, origins, identities, finalized, origin_at, finalized_at)


def referenced_fact_segments(path: Path, data: bytes) -> set[str]:
    """The fact segment files the index ``path`` (bytes ``data``) lists (what retention needs)."""
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
        writer._segments = {
            ref.file: _SegmentInfo(ref.sha256, ref.byte_size, ref.fact_count)
            for ref in loaded.index.segments
        }
        return writer
