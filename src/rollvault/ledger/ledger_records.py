"""Ledger segment records: whole or delta, and resolving a group's chain of them.

A ledger segment (sidecar version 6, :mod:`rollvault.ledger.indexed_sidecar`)
is an immutable file of group records. Two forms are read:

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

from rollvault.ledger.compact_siblings import (
    CompactSibling,
    CompactSiblingState,
    expand_siblings,
)
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.state_schema import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    GroupHeaderState,
    GroupState,
)

LEDGER_SEGMENT_FORMAT: Final = 2
"""The form of the ledger segments this build writes (form 1 is still read)."""
MAX_READ_CHAIN: Final = 64
"""Longest chain of records a reader follows (the writer's bound, 32 records, is below)."""
LEDGER_SEGMENT_SUFFIX: Final = ".ledger-segment.json"

_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_NULL: Final = b"null"
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
LedgerSegmentFileName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}\.ledger-segment\.json$"),
]
RecordLink = tuple[str, int]
"""A record: (ledger segment file, ordinal in it)."""


class RecordOut(msgspec.Struct, array_like=True, frozen=True):
    """One form 2 record to write; ``header`` and the siblings already encoded (:func:`encode_piece`)."""

    base: tuple[int, int] | None
    header: msgspec.Raw | None
    siblings: list[tuple[int, msgspec.Raw]]


class _SegmentOut(msgspec.Struct, frozen=True):
    ledger_segment_format: int
    bases: list[str]
    records: list[RecordOut]


class _SegmentIn(msgspec.Struct, forbid_unknown_fields=True):
    """Either form's fields, decoded in one pass; :func:`decode_ledger_segment` checks
    that exactly one form's are present."""

    schema_version: int | None = None
    groups: list[msgspec.Raw] | None = None
    ledger_segment_format: int | None = None
    bases: list[LedgerSegmentFileName] | None = None
    records: list[msgspec.Raw] | None = None


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
    """Whether a delta may name the newest as its base (form 2; form 1 records are not)."""
    delta_bytes: int = 0
    """Bytes of the pieces (header, siblings) of the chain's deltas, all but its whole record.

    The writer's bound by bytes counts the same (a restored writer goes on from it)."""


def encode_piece(piece: GroupHeaderState | CompactSibling) -> bytes:
    """The deterministic bytes of a header or sibling, as a form 2 record embeds them."""
    return _ENCODER.encode(piece)


def encode_ledger_segment_records(bases: Sequence[str], records: Sequence[RecordOut]) -> bytes:
    """The bytes of a form 2 ledger segment."""
    return _ENCODER.encode(
        _SegmentOut(
            ledger_segment_format=LEDGER_SEGMENT_FORMAT, bases=list(bases), records=list(records)
        )
    )


def decode_ledger_segment(data: bytes, *, name: str) -> SegmentRecords:
    """A ledger segment of either form, its records undecoded."""
    try:
        state = _SEGMENT_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"ledger segment {name}: {exc}") from exc
    if state.ledger_segment_format is None:
        if state.schema_version is None or state.groups is None or state.bases or state.records:
            raise LedgerStateError(
                f"ledger segment {name}: $: neither form 1 (schema_version, groups) nor form "
                f"{LEDGER_SEGMENT_FORMAT} (ledger_segment_format, bases, records)"
            )
        if state.schema_version != ROLLOUT_RECOVERY_SCHEMA_VERSION:
            raise LedgerStateError(
                f"ledger segment {name}: $.schema_version: records of ledger schema "
                f"{state.schema_version}; segments hold schema {ROLLOUT_RECOVERY_SCHEMA_VERSION}"
            )
        return SegmentRecords(form=1, bases=[], records=state.groups)
    if state.ledger_segment_format != LEDGER_SEGMENT_FORMAT:
        raise LedgerStateError(
            f"ledger segment {name}: $.ledger_segment_format: {state.ledger_segment_format}; "
            f"this build reads forms 1 and {LEDGER_SEGMENT_FORMAT}"
        )
    if state.bases is None or state.records is None or state.groups is not None:
        raise LedgerStateError(
            f"ledger segment {name}: $: form {LEDGER_SEGMENT_FORMAT} holds exactly "
            "ledger_segment_format, bases and records"
        )
    if state.schema_version is not None:
        raise LedgerStateError(f"ledger segment {name}: $.schema_version: not a form 2 field")
    return SegmentRecords(form=LEDGER_SEGMENT_FORMAT, bases=state.bases, records=state.records)


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
    header: msgspec.Raw | None = None
    siblings: dict[int, msgspec.Raw] = {}
    links: list[RecordLink] = []
    delta_bytes = 0
    file, ordinal = link
    while True:
        _use(file, ordinal, segments, used, links, where=where)
        segment = segments[file]
        raw = segment.records[ordinal]
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
    return group, RecordChain(tuple(links), True, delta_bytes)


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


def _decode(
    decoder: msgspec.json.Decoder[_T], raw: bytes | msgspec.Raw, file: str, ordinal: int, where: str
) -> _T:
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise LedgerStateError(f"ledger segment {file} record {ordinal} ({where}): {exc}") from exc
