"""The on-disk format of a record journal, and reading it back.

A journal is a directory of segment files. A segment is a header (magic,
format version, the sequence number of its first record) followed by
records, each framed as::

    u32 payload length | u32 CRC-32 of (seq, payload) | u64 seq | payload

all little-endian. Records of a segment have consecutive sequence numbers
starting at the header's, and each segment starts where the previous one
ended, so a reader detects a torn write (a short frame at the end), a
damaged byte (a CRC mismatch) and a lost record (a gap) alike. Payloads are
opaque bytes here: the layers above encode their own schema-checked records
(msgspec) into them, so this layer stays below the ledger.

Reading stops at the first damaged record: nothing after it may be applied,
because a replay must never skip a record. :func:`read_journal` reports where
and why it stopped; :func:`rollvault.durable.journal_writer.repair_journal`
cuts the damage off before a writer appends again.
"""

from __future__ import annotations

import enum
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

JOURNAL_FORMAT_VERSION: Final = 1
SEGMENT_MAGIC: Final = b"RVJOURNL"
_SEGMENT_HEADER: Final = struct.Struct("<8sHQ")
_RECORD_HEADER: Final = struct.Struct("<IIQ")
SEGMENT_HEADER_BYTES: Final = _SEGMENT_HEADER.size
RECORD_HEADER_BYTES: Final = _RECORD_HEADER.size
MAX_RECORD_BYTES: Final = 256 * 1024 * 1024
"""A length field above this is damage, not a record (a sealed group is megabytes)."""

_SEGMENT_RE: Final = re.compile(r"segment_(\d{16})\.journal")


class JournalFormatError(ValueError):
    """A journal directory holds something that is not a journal segment we can read."""


class DamageKind(enum.StrEnum):
    """Why reading a journal stopped before the end of its bytes."""

    TORN = "torn"
    """The last record of the last segment is cut short: a write a crash interrupted."""
    CORRUPT = "corrupt"
    """A whole frame whose CRC does not match, a bad length, or bytes after a short frame."""
    GAP = "gap"
    """A record or segment does not start at the sequence number after the previous one."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One record read back: its sequence number and payload."""

    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class JournalDamage:
    """Where reading stopped: the segment, the byte offset of the first bad record, why."""

    segment: Path
    offset: int
    kind: DamageKind
    detail: str

    def describe(self) -> str:
        return f"{self.segment} at byte {self.offset}: {self.kind.value} ({self.detail})"


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """A segment read up to its end or its first damaged record."""

    path: Path
    first_seq: int
    records: list[JournalRecord]
    good_bytes: int
    """Bytes of header and whole, verified records: where a repair truncates."""
    damage: JournalDamage | None

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.records)


@dataclass(frozen=True, slots=True)
class JournalReplay:
    """Every verified record of a journal in order, and where reading stopped."""

    records: list[JournalRecord]
    segments: list[SegmentScan]
    damage: JournalDamage | None
    next_seq: int
    """The sequence number the next record appended will get."""
    unread_segments: list[Path]
    """Segments after the damage: never replayed (a repair quarantines them)."""


def segment_name(first_seq: int) -> str:
    return f"segment_{first_seq:016d}.journal"


def segment_header(first_seq: int) -> bytes:
    return _SEGMENT_HEADER.pack(SEGMENT_MAGIC, JOURNAL_FORMAT_VERSION, first_seq)


def encode_record(seq: int, payload: bytes) -> bytes:
    """One framed record (header + payload)."""
    buffer = bytearray(RECORD_HEADER_BYTES)
    buffer += payload
    frame_record(buffer, 0, seq)
    return bytes(buffer)


def frame_record(buffer: bytearray, start: int, seq: int) -> None:
    """Fill in the header at ``buffer[start:]`` for the payload after it, to the buffer's end.

    The writer encodes a group's payloads straight into one buffer, each after
    :data:`RECORD_HEADER_BYTES` reserved for its header, then frames it here:
    no per-record bytes object and no copy to join them.
    """
    length = len(buffer) - start - RECORD_HEADER_BYTES
    if length > MAX_RECORD_BYTES:
        raise ValueError(f"journal record {seq}: {length} bytes > {MAX_RECORD_BYTES}")
    with memoryview(buffer) as view:
        crc = _crc(seq, view[start + RECORD_HEADER_BYTES :])
    _RECORD_HEADER.pack_into(buffer, start, length, crc, seq)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """The segment files of ``directory`` by first sequence number (none if it is absent)."""
    if not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        match = _SEGMENT_RE.fullmatch(entry.name)
        if match is not None:
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def read_journal(directory: Path) -> JournalReplay:
    """Read every segment of ``directory`` in order, stopping at the first damage."""
    segments = list_segments(directory)
    scans: list[SegmentScan] = []
    records: list[JournalRecord] = []
    expected: int | None = None
    for position, (first_seq, path) in enumerate(segments):
        is_last = position == len(segments) - 1
        scan = scan_segment(
            path, expected_first_seq=expected, is_last=is_last, named_first_seq=first_seq
        )
        if scan.first_seq != first_seq and scan.damage is None:
            raise JournalFormatError(
                f"{path}: its header says it starts at record {scan.first_seq}, "
                f"its name says {first_seq}"
            )
        scans.append(scan)
        records.extend(scan.records)
        expected = scan.next_seq
        if scan.damage is not None:
            unread = [later for _, later in segments[position + 1 :]]
            return JournalReplay(records, scans, scan.damage, scan.next_seq, unread)
    next_seq = expected if expected is not None else 0
    return JournalReplay(records, scans, None, next_seq, [])


def scan_segment(
    path: Path, *, expected_first_seq: int | None, is_last: bool, named_first_seq: int = 0
) -> SegmentScan:
    """Verify one segment's header and records; ``expected_first_seq`` chains segments.

    ``named_first_seq``: the first record its name gives, where a damaged header of
    the first segment starts (a writer killed while creating the segment that a
    snapshot's rotation left alone: numbering again from 0 would reuse the seqs
    the snapshots cover, and the next writer's segment would collide with it).
    """
    data = path.read_bytes()
    first_seq = _header_first_seq(path, data, expected_first_seq)
    if isinstance(first_seq, JournalDamage):
        start = expected_first_seq if expected_first_seq is not None else named_first_seq
        return SegmentScan(path, start, [], 0, first_seq)
    records: list[JournalRecord] = []
    offset = SEGMENT_HEADER_BYTES
    for item in _frames(path, data, first_seq, is_last):
        if isinstance(item, JournalDamage):
            return SegmentScan(path, first_seq, records, offset, item)
        records.append(item)
        offset += RECORD_HEADER_BYTES + len(item.payload)
    return SegmentScan(path, first_seq, records, offset, None)


def _header_first_seq(
    path: Path, data: bytes, expected_first_seq: int | None
) -> int | JournalDamage:
    if len(data) < SEGMENT_HEADER_BYTES:
        # A segment is created with its header in one write and flushed before
        # any record goes in, so a short header is a crash during creation.
        return JournalDamage(path, 0, DamageKind.TORN, f"header of {len(data)} bytes")
    magic, version, first_seq = _SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        return JournalDamage(path, 0, DamageKind.CORRUPT, f"magic {magic!r}")
    if version != JOURNAL_FORMAT_VERSION:
        raise JournalFormatError(
            f"{path}: journal format version {version}; this rollvault reads version "
            f"{JOURNAL_FORMAT_VERSION} only"
        )
    if expected_first_seq is not None and first_seq != expected_first_seq:
        return JournalDamage(
            path,
            0,
            DamageKind.GAP,
            f"segment starts at record {first_seq}, the previous one ended before "
            f"{expected_first_seq}",
        )
    return int(first_seq)


def _frames(
    path: Path, data: bytes, first_seq: int, is_last: bool
) -> Iterator[JournalRecord | JournalDamage]:
    offset = SEGMENT_HEADER_BYTES
    seq = first_seq
    while offset < len(data):
        remaining = len(data) - offset
        if remaining < RECORD_HEADER_BYTES:
            yield _short(path, offset, is_last, f"{remaining} bytes of a record header")
            return
        length, crc, record_seq = _RECORD_HEADER.unpack_from(data, offset)
        if length > MAX_RECORD_BYTES:
            yield JournalDamage(path, offset, DamageKind.CORRUPT, f"length field {length}")
            return
        end = offset + RECORD_HEADER_BYTES + length
        if end > len(data):
            yield _short(path, offset, is_last, f"record of {length} bytes, {remaining} on disk")
            return
        payload = data[offset + RECORD_HEADER_BYTES : end]
        if crc != _crc(record_seq, payload):
            yield JournalDamage(path, offset, DamageKind.CORRUPT, f"CRC mismatch, record {seq}")
            return
        if record_seq != seq:
            yield JournalDamage(
                path, offset, DamageKind.GAP, f"record {record_seq} where {seq} was next"
            )
            return
        yield JournalRecord(seq, payload)
        offset = end
        seq += 1


def _short(path: Path, offset: int, is_last: bool, detail: str) -> JournalDamage:
    # Only the newest segment is ever being written when a process dies; a
    # short frame anywhere else means bytes were lost after they were flushed.
    kind = DamageKind.TORN if is_last else DamageKind.CORRUPT
    return JournalDamage(path, offset, kind, detail)


def _crc(seq: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(seq.to_bytes(8, "little")))
