"""Ledger segment records: whole or delta, and resolving a group's chain of them.

A ledger segment (sidecar version 6, :mod:`rollvault.ledger.indexed_sidecar`)
is an immutable file of group records. Four forms are read; this build
writes form 4:

- form 1 (the first writer of ledger segments): a version 5 ledger state,
  ``{"schema_version": 5, "groups": [...]}``, each record a whole group;
- form 2 (``{"ledger_segment_format": 2, "bases": [...], "records": [...]}``):
  each record is ``[base, header, siblings]``. ``header`` is the group's
  fields but its siblings (:class:`~rollvault.ledger.state_schema.GroupHeaderState`),
  or null when it equals the base's; ``siblings`` lists ``[index, sibling]``
  pairs, each sibling in its compact form (:mod:`rollvault.ledger.compact_siblings`:
  no empty fields, no derivable receipt fields). A *whole* record has no base, a header and every sibling
  0..n-1. A *delta* record names its base, ``[position in "bases", record
  ordinal]``, an older record of the same group, and holds only the
  siblings that changed since it (a seal changes one): the group is the
  newest record's header and siblings, the rest taken from the chain of
  bases down to a whole record.
- form 3 (``*.ledger-segment.msgpack``, msgpack ``[3, bases, records]``, what
  the previous builds wrote):
  each record is ``[base, header, siblings]`` as in form 2, but its pieces
  are packed arrays (:mod:`rollvault.ledger.packed_groups`) and a delta holds
  only the changed *attempts* of a sibling: ``siblings`` lists
  ``[generation_index, start, attempts]``, the sibling's attempts being its
  base's before position ``start``, then ``attempts`` (a seal changes one
  attempt: the sibling's older attempts are not written again). A whole
  record lists every sibling 0..n-1 from ``start`` 0. A form 3 chain is form
  3 down to its whole record (the writer starts a chain whole in form 3
  when a group of an older form changes).
- form 4 (``*.ledger-segment.msgpack``, msgpack ``[4, bases, records]``,
  what this build writes): a form 3 record with two optional trailing
  parts, ``[base, header, siblings, statuses, header_fields]``, so that a
  delta changing an attempt's status or a few header fields does not write
  the attempt or the header again (a cohort of dispatches rewrote ~30 bytes
  an attempt, a group's status change its ~127-byte header).
  ``statuses`` lists ``[generation_index, position, code]``: the base's
  attempt at ``position`` with its status set to :data:`STATUS_CODES`
  ``[code]``, all else kept; it may only name an attempt the record takes
  from its base (before its sibling's ``start`` when the sibling is patched
  too). ``header_fields`` maps a header field's position to its new value
  (a record holds either ``header`` or ``header_fields``); the patched
  header is decoded again strictly, so every field's type and bound holds.
  A whole record has neither. A form 4 chain may reach form 3 records (a
  form 3 record is a form 4 one without the two parts), never the reverse.

The writer (:mod:`rollvault.controller.snapshots.ledger_segments`) bounds a
chain by its deltas' bytes and to
:data:`~rollvault.controller.snapshots.ledger_segments.MAX_CHAIN` records; a
reader refuses one longer than :data:`MAX_READ_CHAIN` (a cycle in a crafted
file), a base whose segment the sidecar's index does not list (its
SHA-256 would be unchecked), and a record reached twice. Format only, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, TypeVar

import msgspec

from rollvault.ledger.compact_siblings import CompactSiblingState, expand_siblings
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.packed_groups import PackedAttempt, PackedGroup, PackedHeader, group_state
from rollvault.ledger.state_schema import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    GroupHeaderState,
    GroupState,
)
from rollvault.ledger.statuses import RolloutAttemptStatus

LEDGER_SEGMENT_FORMAT: Final = 4
"""The form of the ledger segments this build writes (forms 1 to 3 are still read)."""
PACKED_FORMS: Final = (3, LEDGER_SEGMENT_FORMAT)
"""The msgpack forms read (form 3: what the previous builds wrote)."""
STATUS_CODES: Final[tuple[RolloutAttemptStatus, ...]] = (
    RolloutAttemptStatus.RESERVED,
    RolloutAttemptStatus.DISPATCHED,
    RolloutAttemptStatus.SEALED,
    RolloutAttemptStatus.FAILED,
    RolloutAttemptStatus.ABANDONED,
)
"""A form 4 status patch's code is a position in this tuple: part of the format, never
reordered (a new status goes at the end)."""
STATUS_CODE: Final = {status: code for code, status in enumerate(STATUS_CODES)}
JSON_LEDGER_SEGMENT_FORMAT: Final = 2
"""The newest form written as JSON (a form 2 segment is read, never written)."""
MAX_READ_CHAIN: Final = 64
"""Longest chain of records a reader follows (the writer's bound, 32 records, is below)."""
LEDGER_SEGMENT_SUFFIX: Final = ".ledger-segment.msgpack"
"""The file suffix of a form 3 segment, what this build writes."""
JSON_LEDGER_SEGMENT_SUFFIX: Final = ".ledger-segment.json"
"""The file suffix of a form 1 or 2 segment."""
LEDGER_SEGMENT_SUFFIXES: Final = (LEDGER_SEGMENT_SUFFIX, JSON_LEDGER_SEGMENT_SUFFIX)

_PACKED_ENCODER: Final = msgspec.msgpack.Encoder()
_NULL: Final = b"null"
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
LedgerSegmentFileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}\.ledger-segment\.(json|msgpack)$"),
]
RecordLink = tuple[str, int]
"""A record: (ledger segment file, ordinal in it)."""


class _SegmentIn(msgspec.Struct, forbid_unknown_fields=True):
    """Either form's fields, decoded in one pass; :func:`decode_ledger_segment` checks
    that exactly one form's are present."""

    schema_version: int | None = None
    groups: list[msgspec.Raw] | None = None
    ledger_segment_format: int | None = None
    bases: list[LedgerSegmentFileName] | None = None
    records: list[msgspec.Raw] | None = None


class PackedRecordOut(msgspec.Struct, array_like=True, frozen=True):
    """One form 4 record to write, its pieces already packed (:mod:`.packed_groups`).

    Without ``statuses`` and ``header_fields``, written as the form 3 record of the
    same parts (:func:`encode_packed_record` leaves the two out)."""

    base: tuple[int, int] | None
    header: msgspec.Raw | None
    siblings: list[tuple[int, int, list[msgspec.Raw]]]
    """``(generation_index, start, attempts)``: the attempts from position ``start`` on."""
    statuses: list[tuple[int, int, int]] = msgspec.field(default_factory=list)
    """``(generation_index, position, code)``: the base's attempt there, its status
    :data:`STATUS_CODES` ``[code]``."""
    header_fields: dict[int, msgspec.Raw] | None = None
    """The header's changed fields by position (``header`` is then None)."""


class _PackedSegmentOut(msgspec.Struct, array_like=True, frozen=True):
    ledger_segment_format: int
    bases: list[str]
    records: list[msgspec.Raw]


class _PackedSegmentIn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ledger_segment_format: int
    bases: list[LedgerSegmentFileName]
    records: list[msgspec.Raw]


class _PatchIn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    generation_index: _NonNegativeInt
    start: _NonNegativeInt
    attempts: list[PackedAttempt]


class _PackedRecordIn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    base: tuple[_NonNegativeInt, _NonNegativeInt] | None
    header: PackedHeader | None
    siblings: list[_PatchIn]


_StatusCode = Annotated[int, msgspec.Meta(ge=0, le=len(STATUS_CODES) - 1)]
_HeaderField = Annotated[int, msgspec.Meta(ge=0, le=len(PackedHeader.__struct_fields__) - 1)]


class _StatusPatchIn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    generation_index: _NonNegativeInt
    position: _NonNegativeInt
    code: _StatusCode


class _Form4RecordIn(_PackedRecordIn):
    """A form 4 record: form 3's parts, then the status and header-field patches."""

    statuses: list[_StatusPatchIn] = msgspec.field(default_factory=list)
    header_fields: Annotated[dict[_HeaderField, msgspec.Raw], msgspec.Meta(min_length=1)] | None = (
        None
    )


class _RecordIn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    base: tuple[_NonNegativeInt, _NonNegativeInt] | None
    header: msgspec.Raw
    """``null`` when the base's header holds (msgspec decodes no ``Raw | None``)."""
    siblings: list[tuple[_NonNegativeInt, msgspec.Raw]]


@dataclass(frozen=True)
class SegmentRecords:
    """A decoded ledger segment, its records undecoded (only reached ones are decoded)."""

    form: int
    bases: list[str]
    records: list[msgspec.Raw]

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True)
class RecordChain:
    """The records a group was resolved from, newest first."""

    links: tuple[RecordLink, ...]
    deltable: bool
    """Whether a delta may name the newest as its base (form 3: this build writes no older form)."""
    delta_bytes: int = 0
    """Bytes of the chain's deltas, all but its whole record: in form 3 the delta records'
    own bytes (in form 2 the bytes of their pieces: header, siblings).

    The writer's bound by bytes counts the same (a restored writer goes on from it)."""


def encode_packed_record(record: PackedRecordOut) -> bytes:
    """The bytes of one form 4 record (a delta's bytes are what a chain's bound counts)."""
    return encode_record_parts(
        record.base, record.header, record.siblings, record.statuses, record.header_fields
    )


def encode_record_parts(
    base: tuple[int, int] | None,
    header: msgspec.Raw | None,
    siblings: object,
    statuses: Sequence[tuple[int, int, int]],
    header_fields: Mapping[int, msgspec.Raw] | None,
) -> bytes:
    """A form 4 record of these parts, ``siblings`` as :class:`PackedRecordOut` has them or
    already encoded (a ``msgspec.Raw``): the two form 4 parts only when either is not empty
    (msgspec leaves no trailing default out of an array)."""
    if not statuses and header_fields is None:
        return _PACKED_ENCODER.encode((base, header, siblings))
    return _PACKED_ENCODER.encode((base, header, siblings, statuses, header_fields))


def encode_packed_segment(
    bases: Sequence[str], records: Sequence[bytes], *, form: int = LEDGER_SEGMENT_FORMAT
) -> bytes:
    """The bytes of a form 4 ledger segment of ``records`` (:func:`encode_packed_record`).

    ``form`` 3 only for tests of what the previous builds wrote (records without
    the form 4 parts)."""
    if form not in PACKED_FORMS:
        raise ValueError(f"ledger segment form {form}: msgpack segments are forms {PACKED_FORMS}")
    return _PACKED_ENCODER.encode(
        _PackedSegmentOut(
            ledger_segment_format=form,
            bases=list(bases),
            records=[msgspec.Raw(record) for record in records],
        )
    )


def decode_ledger_segment(data: bytes, *, name: str) -> SegmentRecords:
    """A ledger segment of any form, its records undecoded; its name's suffix says which
    encoding (msgpack: forms 3 and 4; JSON: forms 1 and 2)."""
    if name.endswith(LEDGER_SEGMENT_SUFFIX):
        return _decode_packed_segment(data, name=name)
    try:
        state = _SEGMENT_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"ledger segment {name}: {exc}") from exc
    if state.ledger_segment_format is None:
        if state.schema_version is None or state.groups is None or state.bases or state.records:
            raise LedgerStateError(
                f"ledger segment {name}: $: neither form 1 (schema_version, groups) nor form "
                f"{JSON_LEDGER_SEGMENT_FORMAT} (ledger_segment_format, bases, records)"
            )
        if state.schema_version != ROLLOUT_RECOVERY_SCHEMA_VERSION:
            raise LedgerStateError(
                f"ledger segment {name}: $.schema_version: records of ledger schema "
                f"{state.schema_version}; segments hold schema {ROLLOUT_RECOVERY_SCHEMA_VERSION}"
            )
        return SegmentRecords(form=1, bases=[], records=state.groups)
    if state.ledger_segment_format != JSON_LEDGER_SEGMENT_FORMAT:
        raise LedgerStateError(
            f"ledger segment {name}: $.ledger_segment_format: {state.ledger_segment_format}; "
            f"this build reads JSON segments of forms 1 and {JSON_LEDGER_SEGMENT_FORMAT} "
            f"(forms 3 and {LEDGER_SEGMENT_FORMAT} are msgpack, *{LEDGER_SEGMENT_SUFFIX})"
        )
    if state.bases is None or state.records is None or state.groups is not None:
        raise LedgerStateError(
            f"ledger segment {name}: $: form {JSON_LEDGER_SEGMENT_FORMAT} holds exactly "
            "ledger_segment_format, bases and records"
        )
    if state.schema_version is not None:
        raise LedgerStateError(f"ledger segment {name}: $.schema_version: not a form 2 field")
    return SegmentRecords(form=JSON_LEDGER_SEGMENT_FORMAT, bases=state.bases, records=state.records)


def _decode_packed_segment(data: bytes, *, name: str) -> SegmentRecords:
    try:
        state = _PACKED_SEGMENT_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"ledger segment {name}: {exc}") from exc
    if state.ledger_segment_format not in PACKED_FORMS:
        raise LedgerStateError(
            f"ledger segment {name}: $[0] (ledger_segment_format): "
            f"{state.ledger_segment_format}; a msgpack segment is form 3 or {LEDGER_SEGMENT_FORMAT}"
        )
    return SegmentRecords(
        form=state.ledger_segment_format, bases=state.bases, records=state.records
    )


def resolve_group(
    link: RecordLink,
    segments: Mapping[str, SegmentRecords],
    used: set[RecordLink],
    *,
    where: str,
) -> tuple[GroupState, RecordChain]:
    """The group whose newest record is ``link``, strictly decoded, and its chain.

    ``segments`` are the segments the index lists; ``used`` collects every
    record reached (a record reached twice is refused). ``where`` names the
    index entry in messages.
    """
    group, chain = resolve_group_source(link, segments, used, where=where)
    if isinstance(group, PackedGroup):
        return group_state(group.header, group.siblings), chain
    return group, chain


def resolve_group_source(
    link: RecordLink,
    segments: Mapping[str, SegmentRecords],
    used: set[RecordLink],
    *,
    where: str,
) -> tuple[GroupState | PackedGroup, RecordChain]:
    """:func:`resolve_group`, a form 3 or 4 group left as its decoded pieces (a restore
    builds its records from them: :mod:`rollvault.ledger.checked_groups`)."""
    segment = segments.get(link[0])
    if segment is not None and segment.form in PACKED_FORMS:
        return _resolve_packed(link, segments, used, where=where)
    header: msgspec.Raw | None = None
    siblings: dict[int, msgspec.Raw] = {}
    links: list[RecordLink] = []
    delta_bytes = 0
    file, ordinal = link
    while True:
        _use(file, ordinal, segments, used, links, where=where)
        segment = segments[file]
        raw = segment.records[ordinal]
        if segment.form in PACKED_FORMS:
            raise LedgerStateError(
                f"{where}: the chain reaches {_at(file, ordinal)}, a form "
                f"{segment.form} record, from a form {JSON_LEDGER_SEGMENT_FORMAT} one"
            )
        if segment.form == 1:
            if links[1:]:
                raise LedgerStateError(
                    f"{where}: the chain reaches {_at(file, ordinal)}, a form 1 record"
                )
            group = _decode(_GROUP_DECODER, raw, file, ordinal, where)
            return group, RecordChain(tuple(links), False)
        record = _decode(_RECORD_DECODER, raw, file, ordinal, where)
        has_header = bytes(record.header) != _NULL
        if header is None and has_header:
            header = record.header
        if len({index for index, _ in record.siblings}) != len(record.siblings):
            raise LedgerStateError(f"{where}: {_at(file, ordinal)} lists a sibling twice")
        for index, sibling in record.siblings:
            siblings.setdefault(index, sibling)  # the newest record's version of it wins
        if record.base is None:
            count = len(record.siblings)
            if not has_header or sorted(i for i, _ in record.siblings) != list(range(count)):
                raise LedgerStateError(
                    f"{where}: {_at(file, ordinal)} has no base, so it must hold the header and "
                    "every sibling 0..n-1"
                )
            break
        delta_bytes += (len(record.header) if has_header else 0) + sum(
            len(sibling) for _, sibling in record.siblings
        )
        position, base_ordinal = record.base
        if position >= len(segment.bases):
            raise LedgerStateError(
                f"{where}: {_at(file, ordinal)}'s base names segment {position} of "
                f"{len(segment.bases)} listed in {file}"
            )
        file, ordinal = segment.bases[position], base_ordinal
    extra = sorted(index for index in siblings if index >= count)
    if extra:
        raise LedgerStateError(f"{where}: siblings {extra} of a group of {count} ({link[0]})")
    assert header is not None  # a whole record has one
    fields = msgspec.structs.asdict(_decode(_HEADER_DECODER, header, *link, where))
    # One decode for the siblings (one call each costs more than their bytes).
    joined = b"".join((b"[", b",".join(siblings[i] for i in range(count)), b"]"))
    decoded = _decode(_SIBLINGS_DECODER, joined, *link, where)
    expand_siblings(fields["group_id"], decoded)
    group = GroupState(**fields, siblings=list(decoded))
    # Not deltable: this build writes form 4 deltas only, on form 3 or 4 records.
    return group, RecordChain(tuple(links), False, delta_bytes)


def _resolve_packed(
    link: RecordLink,
    segments: Mapping[str, SegmentRecords],
    used: set[RecordLink],
    *,
    where: str,
) -> tuple[PackedGroup, RecordChain]:
    """:func:`resolve_group_source` for a form 3 or 4 chain.

    The chain's records are decoded newest first, down to its whole record,
    then applied oldest first: a form 4 status patch needs the attempt its
    base holds. A record of a form may reach records of its form or older
    (form 4 on form 3), never newer.
    """
    deltas: list[tuple[_PackedRecordIn, RecordLink]] = []
    links: list[RecordLink] = []
    delta_bytes = 0
    file, ordinal = link
    form = LEDGER_SEGMENT_FORMAT
    while True:
        _use(file, ordinal, segments, used, links, where=where)
        segment = segments[file]
        if segment.form not in PACKED_FORMS or segment.form > form:
            raise LedgerStateError(
                f"{where}: the chain reaches {_at(file, ordinal)}, a form {segment.form} "
                f"record, from a form {form} one"
            )
        form = segment.form
        raw = segment.records[ordinal]
        record: _PackedRecordIn
        if form == LEDGER_SEGMENT_FORMAT:
            record = _decode(_FORM_4_RECORD_DECODER, raw, file, ordinal, where)
        else:
            record = _decode(_FORM_3_RECORD_DECODER, raw, file, ordinal, where)
        if record.base is None:
            if not _whole(record):
                raise LedgerStateError(
                    f"{where}: {_at(file, ordinal)} has no base, so it must hold the header and "
                    "every sibling 0..n-1 from its first attempt (one at least), and no patch"
                )
            break
        deltas.append((record, (file, ordinal)))
        delta_bytes += len(raw)
        position, base_ordinal = record.base
        if position >= len(segment.bases):
            raise LedgerStateError(
                f"{where}: {_at(file, ordinal)}'s base names segment {position} of "
                f"{len(segment.bases)} listed in {file}"
            )
        file, ordinal = segment.bases[position], base_ordinal
    assert record.header is not None  # _whole checked it
    if not deltas:
        # The chain is this one whole record (most groups): nothing to merge.
        pieces = [(patch.generation_index, patch.attempts) for patch in record.siblings]
        return PackedGroup(record.header, pieces), RecordChain(tuple(links), True, 0)
    header = record.header
    attempts = [list(patch.attempts) for patch in record.siblings]
    for delta, (file, ordinal) in reversed(deltas):
        header = _apply(delta, header, attempts, at=_at(file, ordinal), where=where)
    empty = [index for index, have in enumerate(attempts) if not have]
    if empty:
        raise LedgerStateError(f"{where}: siblings {empty} have no attempt ({link[0]})")
    group = PackedGroup(header, list(enumerate(attempts)))
    return group, RecordChain(tuple(links), True, delta_bytes)


def _apply(
    delta: _PackedRecordIn,
    header: PackedHeader,
    attempts: list[list[PackedAttempt]],
    *,
    at: str,
    where: str,
) -> PackedHeader:
    """Apply ``delta`` to its base's group (``attempts`` per sibling, changed in place);
    return the header it leaves."""
    count = len(attempts)
    patched: dict[int, int] = {}
    for patch in delta.siblings:
        index, start = patch.generation_index, patch.start
        if index in patched:
            raise LedgerStateError(f"{where}: {at} lists sibling {index} twice")
        if index >= count:
            raise LedgerStateError(f"{where}: {at}: siblings [{index}] of a group of {count}")
        have = attempts[index]
        if start > len(have):
            raise LedgerStateError(
                f"{where}: {at} holds sibling {index}'s attempts from {start}, its base "
                f"{len(have)}: attempts in between are missing"
            )
        patched[index] = start
        attempts[index] = have[:start] + patch.attempts
    if type(delta) is not _Form4RecordIn:
        return delta.header or header
    seen: set[tuple[int, int]] = set()
    for status in delta.statuses:
        index, position = status.generation_index, status.position
        if index >= count:
            raise LedgerStateError(f"{where}: {at}: siblings [{index}] of a group of {count}")
        if position >= patched.get(index, len(attempts[index])):
            raise LedgerStateError(
                f"{where}: {at} patches the status of sibling {index}'s attempt {position}, "
                "which its base does not hold"
            )
        if (index, position) in seen:
            raise LedgerStateError(
                f"{where}: {at} patches sibling {index}'s attempt {position} twice"
            )
        seen.add((index, position))
        have = attempts[index]
        have[position] = msgspec.structs.replace(have[position], status=STATUS_CODES[status.code])
    if delta.header_fields is None:
        return delta.header or header
    if delta.header is not None:
        raise LedgerStateError(f"{where}: {at} holds both a header and header fields")
    parts = _RAW_PARTS_DECODER.decode(_PACKED_ENCODER.encode(header))
    for position, value in delta.header_fields.items():
        parts[position] = value
    try:
        return _PACKED_HEADER_DECODER.decode(_PACKED_ENCODER.encode(parts))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"{where}: {at}: its header fields give {exc}") from exc


def _whole(record: _PackedRecordIn) -> bool:
    """Whether ``record`` holds its group whole: the header and every sibling 0..n-1,
    each from its first attempt, with at least one attempt, and no form 4 patch (what
    :func:`_resolve_packed` requires of a record without a base)."""
    if record.header is None:
        return False
    if type(record) is _Form4RecordIn and (record.statuses or record.header_fields is not None):
        return False
    # A plain loop, not all() of a generator: a restore asks it of every group's
    # siblings (~16k at 1,024 x 16).
    for number, patch in enumerate(record.siblings):
        if patch.generation_index != number or patch.start != 0 or not patch.attempts:
            return False
    return True


def _use(
    file: str,
    ordinal: int,
    segments: Mapping[str, SegmentRecords],
    used: set[RecordLink],
    links: list[RecordLink],
    *,
    where: str,
) -> None:
    segment = segments.get(file)
    if segment is None:
        raise LedgerStateError(
            f"{where}: the chain reaches ledger segment {file}, which the index does not list"
        )
    if ordinal >= len(segment):
        raise LedgerStateError(f"{where}: record {ordinal} of {file}, which holds {len(segment)}")
    if (file, ordinal) in used:
        raise LedgerStateError(f"{where}: record {ordinal} of {file} is listed twice")
    if len(links) == MAX_READ_CHAIN:
        raise LedgerStateError(f"{where}: a chain of more than {MAX_READ_CHAIN} records")
    used.add((file, ordinal))
    links.append((file, ordinal))


def _at(file: str, ordinal: int) -> str:
    return f"record {ordinal} of {file}"


_T = TypeVar("_T")
_SEGMENT_DECODER: Final = msgspec.json.Decoder(_SegmentIn, strict=True)
_RECORD_DECODER: Final = msgspec.json.Decoder(_RecordIn, strict=True)
_GROUP_DECODER: Final = msgspec.json.Decoder(GroupState, strict=True)
_HEADER_DECODER: Final = msgspec.json.Decoder(GroupHeaderState, strict=True)
_SIBLINGS_DECODER: Final = msgspec.json.Decoder(list[CompactSiblingState], strict=True)
_PACKED_SEGMENT_DECODER: Final = msgspec.msgpack.Decoder(_PackedSegmentIn, strict=True)
_FORM_3_RECORD_DECODER: Final = msgspec.msgpack.Decoder(_PackedRecordIn, strict=True)
_FORM_4_RECORD_DECODER: Final = msgspec.msgpack.Decoder(_Form4RecordIn, strict=True)
_PACKED_HEADER_DECODER: Final = msgspec.msgpack.Decoder(PackedHeader, strict=True)
_RAW_PARTS_DECODER: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _decode(
    decoder: msgspec.json.Decoder[_T] | msgspec.msgpack.Decoder[_T],
    raw: bytes | msgspec.Raw,
    file: str,
    ordinal: int,
    where: str,
) -> _T:
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"ledger segment {file} record {ordinal} ({where}): {exc}") from exc
