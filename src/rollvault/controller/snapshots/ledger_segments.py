"""Writing the ledger incrementally: each group's changes once, into ledger segments.

:class:`LedgerSegmentWriter` writes successive snapshots of one ledger into
one segments directory (the anchor's ``segments/``, beside the row segments).
It remembers, for the last snapshot it *committed*, where each group's newest
record is, the chain of records it resolves through
(:mod:`rollvault.ledger.ledger_records`, form 4), the group's header fields and a
digest of each attempt of each sibling as written (:mod:`rollvault.ledger.packed_groups`),
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
attempt (~100 bytes), not its sibling's older attempts nor the group. An
attempt whose only change is its status (a dispatch) is written as a status
patch (form 4: ~4 bytes, against ~30 for the attempt), and a header whose
fields changed as those fields (a group's status: ~25 bytes against ~127);
for that the writer remembers each attempt's digest without its status, and
the status, and the header's fields as encoded.

Whole rewrites are spread over snapshots by a **budget** (:func:`rewrite_budget`):
a snapshot may rewrite whole records *by choice* up to :data:`REWRITE_SHARE`
times the bytes of its changes (deltas and new groups), plus what the previous
snapshot left unspent while a rewrite was waiting. Two things make a group
*due* a rewrite, and due groups are rewritten in priority order until the next
does not fit; the rest wait (they are recomputed from the writer's state at
every snapshot, so nothing about them needs saving or survives a crash):

- its chain: once the chain's delta records since its whole record, this one
  included, outweigh :func:`chain_budget` times the bytes of the group's whole
  record now (between 1x and 3x, fixed per group, so groups changed in
  lockstep do not come due together). A whole rewrite so costs at most the
  deltas it ends. Until rewritten, the group goes on as deltas;
- compaction: once more than :data:`DEAD_DUE` of the referenced segments'
  bytes are dead (records no live group's chain reaches, estimated by record
  counts), segments are due, the most dead bytes per live record first
  (what leaving one frees per group rewritten), and the groups reaching them
  are rewritten whole so that those segments stop being referenced and
  retention deletes them. Unchanged groups rewritten this way go to a segment
  of their own (``<stem>-ledger-cold``), not beside the changed ones: records
  that survived a segment's decay are the cold ones (groups waiting, not being
  sealed), and mixed with hot records they would be rewritten again each time
  the hot ones around them die.

Hard bounds force a whole rewrite whatever the budget, so restore's cost stays
bounded: a chain of :data:`MAX_CHAIN` records (a backstop: tiny deltas), a
chain whose deltas would pass (:func:`chain_budget` + :data:`CHAIN_BYTES_OVERDUE`)
times the whole record (so a restore decodes at most ~6x a group's whole bytes
and follows at most :data:`MAX_CHAIN` records per group), and segments taken
while more than :data:`DEAD_FORCED` of the referenced bytes are dead (so at
each snapshot's start a restore reads at most ~3.3x the live records' bytes;
twice, as the earlier rule of compacting every segment below half live did,
until the thresholds were raised: see :data:`DEAD_DUE`).
A group whose digests are unknown (restored from a form 1 segment) or whose
siblings changed in number is written whole too. A group restored from a form
1 or 2 segment is written whole (form 4) at its first change; one restored
from a form 3 segment goes on as form 4 deltas on its form 3 records. A restored
writer knows the chains (the restore resolved them, with their deltas' bytes)
but not the digests: it computes them from the restored records, which stay
frozen (shared) until the ledger changes them.

Why a budget: with each segment compacted as soon as it fell below half live
and every chain rewritten as soon as it passed its bound, the benchmark's
steady state (``bench_snapshot_cut.py --incremental 30``) paid it all in a few
snapshots: rounds 22-26 wrote 0.31-1.06 MB of ledger segments (1.5-2.7x the
new rows' bytes), the delta segments of groups sealed in lockstep decaying
together. The constants trade disk and restore reads for write bytes only;
they are not config fields.

Each segment's row (name, SHA-256, size, record count) is written once, into the
**ledger catalog** of the snapshot that writes the segment (sidecar version 10,
:data:`~rollvault.ledger.indexed_sidecar.CATALOG_SIDECAR_SCHEMA_VERSION`): the
sidecar lists the catalogs it uses and each segment by name. Past
:data:`MAX_CATALOGS` catalogs in use, the rows still referenced of those with the
fewest move into the snapshot's new catalog
(:func:`~rollvault.dataplane.segment_catalog.catalogs_to_merge`, the row segments'
rule), so a restore opens at most that many and a snapshot rewrites at most about
the average catalog's live rows. A writer seeded by a restore does not know the
catalogs: its first snapshot writes one describing every segment it references.

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
from functools import cached_property
from pathlib import Path
from typing import Final

import msgspec

from rollvault.controller.snapshots.write_budget import carry_after, take_within, write_budget
from rollvault.dataplane.segment_catalog import WrittenCatalog, plan_catalogs
from rollvault.durable.segment_store import publish_catalog, publish_ledger_segment
from rollvault.ledger.indexed_sidecar import (
    LedgerIndex,
    LedgerSegmentRef,
    encode_ledger_catalog,
    ledger_catalog_file_name,
    ledger_segment_file_name,
)
from rollvault.ledger.ledger_records import (
    STATUS_CODE,
    RecordChain,
    RecordLink,
    encode_packed_segment,
    encode_record_parts,
)
from rollvault.ledger.packed_groups import pack_attempt, pack_header
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.statuses import RolloutAttemptStatus

DEAD_DUE: Final = 0.6
"""Once more than this share of the referenced segments' bytes is dead, segments are due
compaction (their live groups rewritten whole within the budget), the most dead bytes per
live group first, until the share would be back under it.

Why 0.6 (0.4 before): compaction is log-structured cleaning, and cleaning a segment whose
live share is u costs about u / (1 - u) of the bytes it frees; the later a segment is
cleaned, the less of it is still live. At 0.4 the benchmark's long anchor
(``bench_snapshot_cut.py --incremental 100``) rewrote ~19 KB a round from round ~66,
against ~40 KB that 1.1x its ~400 KB of new rows leaves beside them; at 0.6 nothing is
due in its 100 rounds. A dead record costs a restore its read and SHA-256 only (records
are decoded lazily, a live chain's only)."""

DEAD_FORCED: Final = 0.7
"""Once more than this share is dead, those segments' live groups are rewritten whole at
once, whatever the budget: at each snapshot's start a restore reads at most ~3.3x the live
records' bytes (twice at 0.5 before; see :data:`DEAD_DUE`)."""

REWRITE_SHARE: Final = 1.0
"""A snapshot may rewrite whole records, by choice, up to this many times its changes' bytes."""


MAX_CATALOGS: Final = 16
"""Most ledger catalogs one sidecar lists (restore opens each); past it, the referenced rows
of those with the fewest move into the snapshot's new catalog."""


MAX_CHAIN: Final = 32
"""Most records a group's chain holds (its newest included) before it is written whole.

A backstop for restore: the bound by bytes (:func:`chain_budget`) acts first
unless a group's deltas are tiny against it (dispatches only, no seals)."""

CHAIN_BYTES_LOW: Final = 1.0
CHAIN_BYTES_SPAN: Final = 2.0
"""The bound by bytes, as multiples of the group's whole bytes: from LOW to LOW + SPAN."""

CHAIN_BYTES_OVERDUE: Final = 2.0
"""How far past its bound by bytes (in whole bytes) a chain waits for the budget before it
is written whole anyway: a chain's deltas never exceed (its bound + this) x its whole bytes."""


def rewrite_budget(changes: int, carry: int) -> int:
    """Bytes of whole records a snapshot may rewrite by choice: :data:`REWRITE_SHARE` times the
    bytes of its changes (its groups' deltas as planned and its new groups' records), plus
    what the previous snapshot left unspent while a rewrite was waiting for it."""
    return write_budget(REWRITE_SHARE, changes, carry)


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


_AttemptKey = tuple[bytes, RolloutAttemptStatus | None]
"""An attempt's piece as written: the digest of its piece but the status, and the status
(None: the piece is not laid out as :func:`_attempt_key` expects; its digest is then of
the whole piece, and any change of it is written whole)."""
_Digests = tuple[tuple[bytes, ...], tuple[tuple[_AttemptKey, ...], ...]]
"""The header's fields as encoded, then per sibling the key of each of its attempts."""

_STATUS_PIECES: Final = {status: msgspec.msgpack.encode(status) for status in RolloutAttemptStatus}
_STATUS_AT: Final = 19
"""Where an attempt's status starts in its piece: after the array's one-byte header and
the UUID (bin 8: two bytes of header, 16 of UUID; see :mod:`rollvault.ledger.packed_groups`)."""
_HEADER_PARTS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _attempt_key(piece: bytes, status: RolloutAttemptStatus) -> _AttemptKey:
    """``piece``'s key: the digest of all but its status, and its status."""
    encoded = _STATUS_PIECES[status]
    end = _STATUS_AT + len(encoded)
    if piece[_STATUS_AT:end] != encoded:  # not the layout assumed: no status patch for it
        return (_digest(piece), None)
    return (_digest(piece[:_STATUS_AT] + piece[end:]), status)


def _header_parts(header: bytes) -> tuple[bytes, ...]:
    """The header piece's fields, each as encoded (a form 4 delta writes the changed ones)."""
    return tuple(bytes(part) for part in _HEADER_PARTS.decode(header))


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
_StatusPatch = tuple[int, int, int]
"""An attempt whose status alone changed: (generation index, position, status code)."""


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
            _header_parts(header),
            tuple(
                tuple(
                    _attempt_key(piece, attempt.status)
                    for piece, attempt in zip(pieces, sibling.attempts, strict=True)
                )
                for pieces, sibling in zip(siblings, record.siblings, strict=True)
            ),
        )
        return cls(header, siblings, digests)

    def patched(self, patches: Sequence[_Patch]) -> msgspec.Raw:
        """The ``siblings`` part of a form 4 record patching ``patches``, encoded (once: a
        delta's size as planned and the record written share it, see :class:`_Diff`)."""
        return msgspec.Raw(
            _DELTA_ENCODER.encode(
                [
                    (index, start, [msgspec.Raw(piece) for piece in self.siblings[index][start:]])
                    for index, start in patches
                ]
            )
        )

    @cached_property
    def whole_bytes(self) -> bytes:
        """The group's whole record (encoded once: the plan, the budget and the segment use it)."""
        every = [(index, 0) for index in range(len(self.siblings))]
        return encode_record_parts(None, msgspec.Raw(self.header), self.patched(every), (), None)


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


def _sibling_changes(
    old: tuple[_AttemptKey, ...], new: tuple[_AttemptKey, ...]
) -> tuple[int, list[tuple[int, RolloutAttemptStatus]]]:
    """Where ``new`` first differs from ``old`` by more than an attempt's status (new,
    changed otherwise, or gone), and the attempts before it whose status alone changed."""
    statuses: list[tuple[int, RolloutAttemptStatus]] = []
    for position, (a, b) in enumerate(zip(old, new, strict=False)):  # either may be longer
        if a == b:
            continue
        if a[0] == b[0] and a[1] is not None and b[1] is not None:
            statuses.append((position, b[1]))
            continue
        return position, statuses
    return min(len(old), len(new)), statuses


_DELTA_ENCODER: Final = msgspec.msgpack.Encoder()


def _diff_of(digests: _Digests, encoded: _Encoded, known: _Placed) -> _Diff | None:
    """``encoded``'s changes since the record ``digests`` describe; None: not as a delta
    (its siblings are not the same ones)."""
    header, siblings = digests
    new_header, new_siblings = encoded.digests
    if len(siblings) != len(new_siblings) or len(header) != len(new_header):
        return None
    patches: list[_Patch] = []
    statuses: list[_StatusPatch] = []
    for index, (old, new) in enumerate(zip(siblings, new_siblings, strict=True)):
        if old == new:
            continue
        start, changed = _sibling_changes(old, new)
        statuses += [(index, position, STATUS_CODE[status]) for position, status in changed]
        if start < len(old) or start < len(new):
            patches.append((index, start))
    fields = {
        position: msgspec.Raw(part)
        for position, (part, old_part) in enumerate(zip(new_header, header, strict=True))
        if part != old_part
    }
    if not patches and not statuses and not fields:
        return _Diff(None, msgspec.Raw(b""), 0)
    piece: msgspec.Raw | None = None
    if fields and sum(len(part) + 1 for part in fields.values()) >= len(encoded.header):
        piece, fields = msgspec.Raw(encoded.header), {}  # most fields changed: the header
    patched = encoded.patched(patches)
    header_fields = fields or None
    # Its size as planned: the base's position in the segment being built is a small int
    # either way, so the record written is this size or within a byte or two of it.
    planned = encode_record_parts((0, known.ordinal), piece, patched, statuses, header_fields)
    return _Diff(piece, patched, len(planned), tuple(statuses), header_fields)


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
    budget: int = 0
    """Bytes of whole records this snapshot could rewrite by choice (see :func:`rewrite_budget`)."""
    rewritten_bytes: int = 0
    """Bytes of the whole records it rewrote by choice: at most ``budget``."""
    forced_records: int = 0
    """Whole records a bound forced, outside the budget (see the module docstring)."""
    queued_records: int = 0
    """Groups due a rewrite (chain or sparse segment) left for a later snapshot."""
    catalog_bytes: int = 0
    """Bytes of the ledger catalog this snapshot wrote (0: none)."""


def catalog_listing(catalog: WrittenCatalog) -> tuple[str, str, int, int]:
    """How the sidecar lists a ledger catalog (see
    :func:`~rollvault.ledger.indexed_sidecar.encode_catalog_sidecar`)."""
    return (catalog.file, catalog.sha256, catalog.byte_size, len(catalog.segments))


@dataclass
class PendingLedger:
    """A written index the writer adopts as its base once its snapshot is committed."""

    index: LedgerIndex
    placed: dict[str, _Placed]
    segments: dict[str, LedgerSegmentRef]
    info: LedgerWriteInfo
    carry: int = 0
    """The budget this snapshot left unspent, for the next one (see :func:`rewrite_budget`)."""
    catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
    """The catalogs the index's segments are described by (the sidecar lists them)."""


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
class _Step:
    """One live group's part of a snapshot, planned before the budget picks the rewrites."""

    record: PromptGroupRecoveryRecord
    known: _Placed | None
    encoded: _Encoded | None = None
    """None: unchanged since its record, not encoded (unless chosen for a rewrite)."""
    diff: _Diff | None = None
    """Its changes as a delta on ``known``; None: nothing to write as a delta."""
    whole: bool = False
    """Written whole whatever the budget: new, or a bound forces it."""
    due: tuple[float, float] | None = None
    """A rewrite is due (priority, lowest first; see :meth:`LedgerSegmentWriter._plan`)."""
    rewrite: bool = False
    """Chosen: rewritten whole within the budget."""

    def encode(self) -> _Encoded:
        if self.encoded is None:
            self.encoded = _Encoded.of(self.record)
        return self.encoded

    @property
    def changed(self) -> bool:
        return self.known is None or self.known.token is not self.record.siblings


@dataclass(frozen=True)
class _Diff:
    """A changed group's delta on its newest record: its pieces, encoded once (the record
    written adds only its base, :meth:`record`), and its bytes as planned."""

    header: msgspec.Raw | None
    """The group's header when it changed (and ``header_fields`` would not be smaller)."""
    siblings: msgspec.Raw
    """The changed siblings' attempts, each from its first change on (but a status-only
    change before it), encoded."""
    size: int
    statuses: tuple[_StatusPatch, ...] = ()
    """The base's attempts whose status alone changed."""
    header_fields: dict[int, msgspec.Raw] | None = None
    """The header's changed fields, when that is smaller than the header."""

    def record(self, base: tuple[int, int]) -> bytes:
        """The delta record on the record at ``base`` (its segment's position, its ordinal)."""
        # The same bytes as encode_packed_record of its PackedRecordOut (tested), its
        # siblings part encoded once (the size as planned and the record written share it).
        return encode_record_parts(
            base, self.header, self.siblings, self.statuses, self.header_fields
        )


@dataclass
class LedgerSegmentWriter:
    """Writes the ledger part of successive snapshots into ``segments_dir`` (one per dir)."""

    segments_dir: Path
    last_written: PendingLedger | None = None
    """What the last :meth:`write` wrote, for the caller to pass to :meth:`committed`."""
    _placed: dict[str, _Placed] = field(default_factory=dict)
    _segments: dict[str, LedgerSegmentRef] = field(default_factory=dict)
    _carry: int = 0
    _catalogs: dict[str, WrittenCatalog] = field(default_factory=dict)
    """The catalogs the last committed snapshot lists."""

    def write(self, records: Sequence[PromptGroupRecoveryRecord], *, stem: str) -> PendingLedger:
        """Write the changes of ``records`` (the live groups, in ledger order).

        The new segments, named after ``stem``, are durable when this returns.
        Call :meth:`committed` once the snapshot that holds the index is.
        """
        compaction = self._compaction(records)
        steps = [self._plan(record, compaction) for record in records]
        changes = sum(
            len(step.encode().whole_bytes) if step.whole and step.known is None else 0
            for step in steps
        ) + sum(step.diff.size for step in steps if step.diff is not None)
        budget = rewrite_budget(changes, self._carry)
        spent = self._choose(steps, budget)
        fresh = _SegmentBuild(ledger_segment_file_name(stem))
        cold = _SegmentBuild(_cold_name(stem))
        placed = {step.record.group_id: self._emit(step, fresh, cold) for step in steps}
        segments = {
            file: self._segments[file]
            for group in placed.values()
            for file, _ in group.chain
            if file in self._segments
        }
        segment_bytes = sum(self._publish(build, segments) for build in (fresh, cold))
        catalogs, catalog_bytes = self._catalogs_for(segments, stem)
        listed = sorted(segments)
        position = {file: number for number, file in enumerate(listed)}
        index = LedgerIndex(
            segments=[segments[file] for file in listed],
            groups=[
                (position[placed[r.group_id].segment], placed[r.group_id].ordinal) for r in records
            ],
        )
        forced = sum(1 for step in steps if step.whole and step.known is not None)
        info = LedgerWriteInfo(
            segment_bytes=segment_bytes,
            new_records=len(fresh.records) + len(cold.records),
            compacted_records=len(cold.records),
            referenced=tuple(listed),
            delta_records=sum(1 for s in steps if s.diff is not None and not s.rewrite),
            budget=budget,
            rewritten_bytes=spent,
            forced_records=forced,
            queued_records=sum(1 for s in steps if s.due is not None and not s.rewrite),
            catalog_bytes=catalog_bytes,
        )
        carry = carry_after(budget, spent, waiting=info.queued_records > 0)
        self.last_written = PendingLedger(
            index=index,
            placed=placed,
            segments=segments,
            info=info,
            carry=carry,
            catalogs=catalogs,
        )
        return self.last_written

    def _plan(
        self, record: PromptGroupRecoveryRecord, compaction: dict[str, tuple[int, bool]]
    ) -> _Step:
        """What ``record`` needs: nothing, a delta, whole (new or forced by a bound), or a
        rewrite when the budget allows (``due``; by priority: groups leaving the segments due
        compaction first, in :meth:`_compaction`'s order, then chains by how far their deltas
        are past their bound)."""
        known = self._placed.get(record.group_id)
        step = _Step(record, known)
        if known is None:
            step.whole = True
            return step
        leaving = [compaction[file] for file, _ in known.chain if file in compaction]
        if any(forced for _, forced in leaving):
            step.whole = True  # too much is dead to wait for the budget
            return step
        overdue = 0.0
        if step.changed:
            encoded = step.encode()
            digests = known.known_digests()
            diff = None if digests is None else _diff_of(digests, encoded, known)
            if diff is None or len(known.chain) >= MAX_CHAIN:
                step.whole = True
                return step
            whole = len(encoded.whole_bytes)
            chain_bytes = known.delta_bytes + diff.size
            bound = chain_budget(record.group_id)
            if chain_bytes > (bound + CHAIN_BYTES_OVERDUE) * whole:
                step.whole = True  # waited long enough for the budget
                return step
            step.diff = diff if diff.size else None
            overdue = chain_bytes / (bound * whole)
        if leaving or overdue > 1.0:
            rank = min((rank for rank, _ in leaving), default=len(compaction))
            step.due = (rank, -overdue)
        return step

    @staticmethod
    def _choose(steps: list[_Step], budget: int) -> int:
        """Mark the due rewrites to make, by priority, within ``budget``; return the bytes
        they cost (a group's whole record is encoded only once it is its turn)."""
        due = sorted((s for s in steps if s.due is not None), key=lambda s: s.due or ())
        chosen, spent = take_within(budget, ((len(s.encode().whole_bytes), s) for s in due))
        for step in chosen:
            step.rewrite = True
        return spent

    @staticmethod
    def _emit(step: _Step, fresh: _SegmentBuild, cold: _SegmentBuild) -> _Placed:
        """Add ``step``'s record, if any, to its segment; where the group is now."""
        record, known = step.record, step.known
        if step.whole or step.rewrite:
            encoded = step.encode()
            # Unchanged groups rewritten only to leave a sparse segment go apart (cold).
            target = cold if not step.changed else fresh
            return _Placed(record.siblings, target.add(encoded.whole_bytes), encoded.digests)
        assert known is not None  # a new group is whole
        if not step.changed:
            return known
        encoded = step.encode()
        if step.diff is None:  # copied by the ledger, not changed: nothing to write
            return _Placed(
                record.siblings, known.chain, encoded.digests, delta_bytes=known.delta_bytes
            )
        delta = step.diff.record(fresh.base_position(known))
        return _Placed(
            record.siblings,
            fresh.add(delta, known),
            encoded.digests,
            delta_bytes=known.delta_bytes + len(delta),
        )

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

    def _catalogs_for(
        self, segments: dict[str, LedgerSegmentRef], stem: str
    ) -> tuple[dict[str, WrittenCatalog], int]:
        """The catalogs describing ``segments`` (each by exactly one), and the bytes of the new
        one: it describes the segments no kept catalog does (new, or a seeded writer's) and
        those of the catalogs merged past :data:`MAX_CATALOGS`; durable when this returns."""
        plan = plan_catalogs(self._catalogs, segments, limit=MAX_CATALOGS)
        kept = plan.kept
        if not plan.moving:
            return kept, 0
        data = encode_ledger_catalog([segments[file] for file in plan.moving])
        file = ledger_catalog_file_name(stem)
        publish_catalog(self.segments_dir / file, data)
        kept[file] = WrittenCatalog(
            file, hashlib.sha256(data).hexdigest(), len(data), tuple(plan.moving)
        )
        return kept, len(data)

    def _compaction(
        self, records: Sequence[PromptGroupRecoveryRecord]
    ) -> dict[str, tuple[int, bool]]:
        """The referenced segments to compact: per file its rank and whether it is forced.

        A segment's dead bytes are estimated by its records no live chain reaches (records
        of one segment are of a size). Segments are taken by dead bytes per live record (what
        compacting one frees per group rewritten), while the dead share of the referenced
        bytes is over :data:`DEAD_DUE`; those taken while it is over :data:`DEAD_FORCED`
        are forced.
        """
        live: Counter[str] = Counter()
        for record in records:
            known = self._placed.get(record.group_id)
            if known is not None:
                live.update(file for file, _ in known.chain)
        dead_of = {
            file: self._segments[file].byte_size * (1 - count / self._segments[file].record_count)
            for file, count in live.items()
        }
        total = float(sum(self._segments[file].byte_size for file in live))
        dead = sum(dead_of.values())
        order = sorted(live, key=lambda file: (-dead_of[file] / live[file], file))
        compaction: dict[str, tuple[int, bool]] = {}
        for rank, file in enumerate(order):
            if dead <= DEAD_DUE * total or dead_of[file] <= 0:
                break
            compaction[file] = (rank, dead > DEAD_FORCED * total)
            # Once compacted, its dead bytes are gone and its live ones are written again.
            dead -= dead_of[file]
            total -= dead_of[file]
        return compaction

    def committed(self, pending: PendingLedger) -> None:
        """Make ``pending`` the base of the next snapshot: it is committed now."""
        self._placed = pending.placed
        self._segments = pending.segments
        self._carry = pending.carry
        self._catalogs = pending.catalogs
        self.last_written = None

    def base_segments(self) -> set[str]:
        """Ledger segment and catalog files the last committed snapshot references."""
        return set(self._segments) | set(self._catalogs)
