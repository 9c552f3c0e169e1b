"""Writing the ledger incrementally: each group's changes once, into ledger segments.

:class:`LedgerSegmentWriter` writes successive snapshots of one ledger into
one segments directory (the anchor's ``segments/``, beside the row segments).
It remembers, for the last snapshot it *committed*, where each group's newest
record is, the chain of records it resolves through
(:mod:`rollvault.ledger.ledger_records`, form 3), a digest of the group's header and
of each attempt of each sibling as written (:mod:`rollvault.ledger.packed_groups`),
and the token it was written for: the record's
``siblings`` list. The ledger's copy-on-write capture guarantees that token:
once a capture shares a record, the ledger copies the whole record (siblings
list included) before its next change, and only the runtime prompt payload
(never persisted) is ever set on a shared record's new shell, keeping its
siblings. So a group whose siblings list is the one remembered has not
changed since that snapshot, and costs an index entry; every other group is
encoded attempt by attempt, and only the header and the attempts whose bytes
differ from the remembered digests are written (per sibling, its attempts
from the first that differs on), as a *delta* record naming the group's
previous record as its base. A seal changes one attempt, so it costs that
attempt (~100 bytes), not its sibling's older attempts nor the group.

Chains are bounded by bytes: a group is written whole once its chain's
delta records since its whole record, this one included, would outweigh
:func:`chain_budget` times the bytes of the group's whole record now (see
there: between 1x and 3x, fixed per group). A whole rewrite so costs at most
the deltas it ends, and groups changed in lockstep (every seal of a round in
the same groups) do not all reach it in one snapshot, as they did under a
bound by count. A group whose chain already holds :data:`MAX_CHAIN` records
(a backstop: tiny deltas), or reaches a segment being compacted, or whose
digests are unknown (restored from a form 1 segment), is written whole too,
so restore follows at most :data:`MAX_CHAIN` records per group. A group
restored from a form 1 or 2 segment is written whole (form 3) at its first
change. A restored writer knows the chains (the restore resolved them, with
their deltas' bytes) but not the digests: it computes them from the restored
records, which stay frozen (shared) until the ledger changes them.

Compaction: a referenced segment whose live records (every record a live
group's chain reaches) fall below ``compact_below`` of its records has the
groups reaching it rewritten whole, so that it stops being referenced and
retention deletes it. That bounds the dead bytes on disk to about as many
again as the live ones. Unchanged groups rewritten this way go to a segment
of their own (``<stem>-ledger-cold``), not beside the changed ones: records
that survived a segment's decay are the cold ones (groups waiting, not being
sealed), and mixed with hot records they would be rewritten again each time
the hot ones around them die (the first measurement, mixed, rewrote 36% more
records per snapshot after 10 rounds and still growing). The fraction and
the chain bound are constants, not config fields: they trade disk and
restore reads for write bytes only, and nothing measured yet asks to tune
them.

A snapshot that fails or is never committed leaves its segment unreferenced,
for the next collection (:mod:`.segment_retention`); the writer still
describes the last committed snapshot, so the next try writes those records
again.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from rollvault.durable.segment_store import publish_ledger_segment
from rollvault.ledger.indexed_sidecar import (
    LedgerIndex,
    LedgerSegmentRef,
    ledger_segment_file_name,
)
from rollvault.ledger.ledger_records import (
    PackedRecordOut,
    RecordChain,
    RecordLink,
    encode_packed_record,
    encode_packed_segment,
)
from rollvault.ledger.packed_groups import pack_attempt, pack_header
from rollvault.ledger.records import PromptGroupRecoveryRecord

COMPACT_BELOW: Final = 0.5
"""Rewrite a segment's live records once fewer than this fraction of its records are live."""


MAX_CHAIN: Final = 32
"""Most records a group's chain holds (its newest included) before it is written whole.

A backstop for restore: the bound by bytes (:func:`chain_budget`) acts first
unless a group's deltas are tiny against it (dispatches only, no seals)."""

CHAIN_BYTES_LOW: Final = 1.0
CHAIN_BYTES_SPAN: Final = 2.0
"""The bound by bytes, as multiples of the group's whole bytes: from LOW to LOW + SPAN."""


def chain_budget(group_id: str) -> float:
    """How many times its whole bytes a group's chain of deltas may hold: in [1, 3).

    At 1x or more a whole rewrite costs no more than the deltas it ends (so
    the rewrites add at most about as much again as the deltas, ~0.55x at
    these bounds); spread by a hash of the id so that groups changed together
    are written whole in different snapshots (the benchmark seals into the
    same 256 groups each round: under a bound of 8 records, every one of them
    was rewritten in the 8th). Deterministic, so a restored writer agrees.
    """
    spread = hashlib.blake2b(group_id.encode(), digest_size=2).digest()
    return CHAIN_BYTES_LOW + CHAIN_BYTES_SPAN * int.from_bytes(spread) / 65536


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_Digests = tuple[bytes, tuple[tuple[bytes, ...], ...]]
"""The header's digest, then per sibling the digest of each of its attempts."""


@dataclass(frozen=True)
class _Placed:
    token: object
    """The record's siblings list when it was written (see the module docstring)."""
    chain: tuple[RecordLink, ...]
    """Its records, newest first: (segment file, ordinal)."""
    digests: _Digests | None
    """The pieces' digests as written; None: not known (see ``source``)."""
    source: PromptGroupRecoveryRecord | None = None
    """A restored, frozen record the digests are computed from when needed (None: not deltable)."""
    delta_bytes: int = 0
    """Bytes of the chain's delta records above its whole record (the bound by bytes)."""

    @property
    def segment(self) -> str:
        return self.chain[0][0]

    @property
    def ordinal(self) -> int:
        return self.chain[0][1]

    def known_digests(self) -> _Digests | None:
        if self.digests is None and self.source is not None:
            return _Encoded.of(self.source).digests
        return self.digests


_Patch = tuple[int, int]
"""A sibling's changed attempts: (generation index, position of the first that changed)."""


@dataclass(frozen=True)
class _Encoded:
    """A group encoded piece by piece: its header, then each sibling's attempts."""

    header: bytes
    siblings: tuple[tuple[bytes, ...], ...]
    digests: _Digests

    @classmethod
    def of(cls, record: PromptGroupRecoveryRecord) -> _Encoded:
        group_id = record.group_id
        header = pack_header(record)
        siblings = tuple(
            tuple(
                pack_attempt(f"{group_id}_g{s.generation_index}_a", attempt)
                for attempt in s.attempts
            )
            for s in record.siblings
        )
        digests = (
            _digest(header),
            tuple(tuple(_digest(piece) for piece in attempts) for attempts in siblings),
        )
        return cls(header, siblings, digests)

    def record(
        self, base: tuple[int, int] | None, header: bool, patches: Sequence[_Patch]
    ) -> bytes:
        """A form 3 record: ``header`` or not, each patched sibling's attempts from its start."""
        return encode_packed_record(
            PackedRecordOut(
                base=base,
                header=msgspec.Raw(self.header) if header else None,
                siblings=[
                    (index, start, [msgspec.Raw(piece) for piece in self.siblings[index][start:]])
                    for index, start in patches
                ],
            )
        )

    def whole(self) -> bytes:
        """The group's whole record."""
        return self.record(None, True, [(index, 0) for index in range(len(self.siblings))])


@dataclass
class _SegmentBuild:
    """The records of one new segment, placed as they are added."""

    file: str
    records: list[bytes] = field(default_factory=list)
    bases: dict[str, int] = field(default_factory=dict)

    def base_position(self, base: _Placed) -> tuple[int, int]:
        """How a record of this segment names ``base`` (its segment listed once added)."""
        return (self.bases.get(base.segment, len(self.bases)), base.ordinal)

    def add(self, record: bytes, base: _Placed | None = None) -> tuple[RecordLink, ...]:
        """Add an encoded record, a delta on ``base`` (named by :meth:`base_position`) or whole."""
        self.records.append(record)
        if base is None:
            return ((self.file, len(self.records) - 1),)
        self.bases.setdefault(base.segment, len(self.bases))
        return ((self.file, len(self.records) - 1), *base.chain)

    def encode(self) -> bytes:
        return encode_packed_segment(list(self.bases), self.records)


def _first_change(old: tuple[bytes, ...], new: tuple[bytes, ...]) -> int:
    """Position of the first attempt of ``new`` that is not ``old``'s (new or changed)."""
    for position, (a, b) in enumerate(zip(old, new, strict=False)):  # either may be longer
        if a != b:
            return position
    return min(len(old), len(new))


def _cold_name(stem: str) -> str:
    return ledger_segment_file_name(f"{stem}-cold")


@dataclass(frozen=True)
class LedgerWriteInfo:
    """What one :meth:`LedgerSegmentWriter.write` did."""

    segment_bytes: int
    new_records: int
    """Records written: changed or new groups, and the compacted ones."""
    compacted_records: int
    referenced: tuple[str, ...]
    delta_records: int = 0
    """Of ``new_records``, those written as deltas (only the changed siblings)."""


@dataclass
class PendingLedger:
    """A written index the writer adopts as its base once its snapshot is committed."""

    index: LedgerIndex
    placed: dict[str, _Placed]
    segments: dict[str, LedgerSegmentRef]
    info: LedgerWriteInfo


@dataclass(frozen=True)
class LedgerSeed:
    """A restored ledger's records and the index they were loaded from, to seed a writer.

    ``records`` are the ledger's records right after the load, in index order,
    marked shared (``shared_groups``), so their siblings lists stand for the
    loaded records. ``chains`` are the records each group was resolved from
    (:func:`~rollvault.ledger.indexed_sidecar.assemble_indexed_ledger`), in
    the same order.
    """

    segments_dir: Path
    records: Sequence[PromptGroupRecoveryRecord]
    index: LedgerIndex
    chains: Sequence[RecordChain]

    def writer(self) -> LedgerSegmentWriter:
        """A writer whose next snapshot writes only groups changed since the restored one."""
        writer = LedgerSegmentWriter(self.segments_dir)
        placed = {}
        for record, (segment, ordinal), chain in zip(
            self.records, self.index.groups, self.chains, strict=True
        ):
            if chain.links[0] != (self.index.segments[segment].file, ordinal):
                raise ValueError(
                    f"ledger seed: group {record.group_id!r}'s chain starts at {chain.links[0]}, "
                    f"its index entry names record {ordinal} of segment {segment}"
                )
            source = record if chain.deltable else None
            placed[record.group_id] = _Placed(
                record.siblings, chain.links, None, source, chain.delta_bytes
            )
        writer._placed = placed
        writer._segments = {ref.file: ref for ref in self.index.segments}
        return writer


@dataclass
class LedgerSegmentWriter:
    """Writes the ledger part of successive snapshots into ``segments_dir`` (one per dir)."""

    segments_dir: Path
    compact_below: float = COMPACT_BELOW
    last_written: PendingLedger | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _placed: dict[str, _Placed] = field(default_factory=dict)
    _segments: dict[str, LedgerSegmentRef] = field(default_factory=dict)

    def write(self, records: Sequence[PromptGroupRecoveryRecord], *, stem: str) -> PendingLedger:
        """Write the changes of ``records`` (the live groups, in ledger order).

        The new segments, named after ``stem``, are durable when this returns.
        Call :meth:`committed` once the snapshot that holds the index is.
        """
        sparse = self._sparse(records)
        fresh = _SegmentBuild(ledger_segment_file_name(stem))
        cold = _SegmentBuild(_cold_name(stem))
        placed: dict[str, _Placed] = {}
        deltas = compacted = 0
        for record in records:
            known = self._placed.get(record.group_id)
            if known is not None and sparse.isdisjoint(file for file, _ in known.chain):
                if known.token is record.siblings:
                    placed[record.group_id] = known
                    continue
                encoded = _Encoded.of(record)
                delta = self._delta(known, encoded, fresh, record.group_id)
                if delta is not None:
                    chain, delta_bytes = known.chain, known.delta_bytes
                    if delta:
                        chain = fresh.add(delta, known)
                        delta_bytes += len(delta)
                        deltas += 1
                    # else copied by the ledger, not changed: nothing to write
                    placed[record.group_id] = _Placed(
                        record.siblings, chain, encoded.digests, delta_bytes=delta_bytes
                    )
                    continue
            else:
                encoded = _Encoded.of(record)
            target = fresh
            if known is not None and known.token is record.siblings:
                target = cold  # unchanged, rewritten only to leave a sparse segment
                compacted += 1
            chain = target.add(encoded.whole())
            placed[record.group_id] = _Placed(record.siblings, chain, encoded.digests)
        segments = {
            file: self._segments[file]
            for group in placed.values()
            for file, _ in group.chain
            if file in self._segments
        }
        segment_bytes = sum(self._publish(build, segments) for build in (fresh, cold))
        listed = sorted(segments)
        position = {file: number for number, file in enumerate(listed)}
        index = LedgerIndex(
            segments=[segments[file] for file in listed],
            groups=[
                (position[placed[r.group_id].segment], placed[r.group_id].ordinal) for r in records
            ],
        )
        info = LedgerWriteInfo(
            segment_bytes=segment_bytes,
            new_records=len(fresh.records) + len(cold.records),
            compacted_records=compacted,
            referenced=tuple(listed),
            delta_records=deltas,
        )
        self.last_written = PendingLedger(index=index, placed=placed, segments=segments, info=info)
        return self.last_written

    @staticmethod
    def _delta(
        known: _Placed, encoded: _Encoded, build: _SegmentBuild, group_id: str
    ) -> bytes | None:
        """The delta record of ``encoded`` on ``known`` for ``build``; b"": nothing changed;
        None: write it whole (see the module docstring)."""
        digests = known.known_digests()
        if digests is None or len(known.chain) >= MAX_CHAIN:
            return None
        header, siblings = digests
        new_header, new_siblings = encoded.digests
        if len(siblings) != len(new_siblings):
            return None
        patches = [
            (index, _first_change(old, new))
            for index, (old, new) in enumerate(zip(siblings, new_siblings, strict=True))
            if old != new
        ]
        if not patches and header == new_header:
            return b""
        delta = encoded.record(build.base_position(known), header != new_header, patches)
        if known.delta_bytes + len(delta) > chain_budget(group_id) * len(encoded.whole()):
            return None
        return delta

    def _publish(self, build: _SegmentBuild, segments: dict[str, LedgerSegmentRef]) -> int:
        """Write ``build``'s records as its segment, if any; return its bytes."""
        if not build.records:
            return 0
        data = build.encode()
        publish_ledger_segment(self.segments_dir / build.file, data)
        segments[build.file] = LedgerSegmentRef(
            file=build.file,
            sha256=hashlib.sha256(data).hexdigest(),
            byte_size=len(data),
            record_count=len(build.records),
        )
        return len(data)

    def _sparse(self, records: Sequence[PromptGroupRecoveryRecord]) -> set[str]:
        """Referenced segments fewer than ``compact_below`` of whose records live groups reach."""
        live: Counter[str] = Counter()
        for record in records:
            known = self._placed.get(record.group_id)
            if known is not None:
                live.update(file for file, _ in known.chain)
        return {
            file
            for file, count in live.items()
            if count < self.compact_below * self._segments[file].record_count
        }

    def committed(self, pending: PendingLedger) -> None:
        """Make ``pending`` the base of the next snapshot: it is committed now."""
        self._placed = pending.placed
        self._segments = pending.segments
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Ledger segment files the last committed snapshot references."""
        return set(self._segments)
