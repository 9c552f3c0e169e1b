"""The record journal: framing, torn and damaged tails, group commit, rotation."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.durable import journal_writer
from rollvault.durable.journal_format import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    DamageKind,
    JournalFormatError,
    list_segments,
    read_journal,
    segment_header,
    segment_name,
)
from rollvault.durable.journal_writer import (
    QUARANTINE_SUFFIX,
    JournalWriteError,
    JournalWriter,
    repair_journal,
)


def payload(seq: int, size: int = 40) -> bytes:
    return (f"record {seq}:".encode() * size)[:size]


def write_records(directory: Path, seqs: range, **kwargs: float) -> JournalWriter:
    writer, _ = JournalWriter.open(directory, **kwargs)  # type: ignore[arg-type]
    for seq in seqs:
        assert writer.append(payload(seq)) == seq
    writer.wait_durable(seqs[-1], timeout=30)
    return writer


def test_records_read_back_in_order_and_a_reopen_continues_the_sequence(tmp_path: Path) -> None:
    write_records(tmp_path, range(0, 5)).close()
    writer = write_records(tmp_path, range(5, 9))
    writer.close()
    replay = read_journal(tmp_path)
    assert [r.seq for r in replay.records] == list(range(9))
    assert all(r.payload == payload(r.seq) for r in replay.records)
    assert replay.damage is None and replay.next_seq == 9
    # Each writer starts its own segment: never appends to one a crash may have torn.
    assert [first for first, _ in list_segments(tmp_path)] == [0, 5]


def test_an_absent_or_empty_journal_starts_at_zero(tmp_path: Path) -> None:
    assert read_journal(tmp_path / "none").next_seq == 0
    writer, repair = JournalWriter.open(tmp_path / "j")
    assert repair.replay.records == [] and repair.truncated is None
    assert writer.append(b"x") == 0
    writer.close()


def test_a_torn_tail_at_every_byte_is_cut_back_to_the_last_whole_record(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_records(source, range(3)).close()
    ((_, segment),) = list_segments(source)
    whole = segment.read_bytes()
    record_bytes = RECORD_HEADER_BYTES + len(payload(0))
    for cut in range(SEGMENT_HEADER_BYTES, len(whole)):
        journal = tmp_path / f"cut{cut}"
        journal.mkdir()
        (journal / segment.name).write_bytes(whole[:cut])
        whole_records = (cut - SEGMENT_HEADER_BYTES) // record_bytes
        replay = read_journal(journal)
        assert [r.seq for r in replay.records] == list(range(whole_records))
        at_boundary = (cut - SEGMENT_HEADER_BYTES) % record_bytes == 0
        assert (replay.damage is None) == at_boundary
        if not at_boundary:
            assert replay.damage is not None and replay.damage.kind is DamageKind.TORN
        repair = repair_journal(journal)
        assert repair.truncated == replay.damage
        assert (journal / segment.name).stat().st_size == (
            SEGMENT_HEADER_BYTES + whole_records * record_bytes
        )
        writer, _ = JournalWriter.open(journal)
        assert writer.append(b"after") == whole_records
        writer.close()
        assert len(read_journal(journal).records) == whole_records + 1
        assert read_journal(journal).records[-1].payload == b"after"


def test_a_damaged_byte_stops_the_replay_and_quarantines_later_segments(tmp_path: Path) -> None:
    write_records(tmp_path, range(0, 4)).close()
    write_records(tmp_path, range(4, 6)).close()
    (_, first), (_, second) = list_segments(tmp_path)
    data = bytearray(first.read_bytes())
    record_bytes = RECORD_HEADER_BYTES + len(payload(0))
    data[SEGMENT_HEADER_BYTES + 2 * record_bytes + RECORD_HEADER_BYTES + 3] ^= 0xFF
    first.write_bytes(bytes(data))

    replay = read_journal(tmp_path)
    assert [r.seq for r in replay.records] == [0, 1]
    assert replay.damage is not None and replay.damage.kind is DamageKind.CORRUPT
    assert "CRC mismatch, record 2" in replay.damage.describe()
    assert replay.unread_segments == [second]

    writer, repair = JournalWriter.open(tmp_path)
    assert repair.quarantined == [second.with_name(second.name + QUARANTINE_SUFFIX)]
    assert repair.quarantined[0].exists() and not second.exists()
    assert writer.append(b"next") == 2
    writer.close()
    assert [r.seq for r in read_journal(tmp_path).records] == [0, 1, 2]


def test_a_segment_that_does_not_chain_is_a_gap(tmp_path: Path) -> None:
    write_records(tmp_path, range(0, 3)).close()
    (tmp_path / segment_name(7)).write_bytes(segment_header(7))
    replay = read_journal(tmp_path)
    assert [r.seq for r in replay.records] == [0, 1, 2]
    assert replay.damage is not None and replay.damage.kind is DamageKind.GAP


def test_a_newer_format_version_is_refused_by_name(tmp_path: Path) -> None:
    header = bytearray(segment_header(0))
    header[8] = 9
    (tmp_path / segment_name(0)).write_bytes(bytes(header))
    with pytest.raises(JournalFormatError, match="format version 9"):
        read_journal(tmp_path)


def test_group_commit_flushes_many_records_per_fsync(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=5.0, commit_max_records=100)
    for seq in range(1000):
        writer.append(payload(seq))
    assert writer.wait_durable(999, timeout=60)
    stats = writer.stats()
    writer.close()
    assert stats.durable_seq == 999 and stats.appended_seq == 999
    # A full group (100 records) flushes at once, without waiting out the 5 s
    # interval; a slow appender can only split groups further, never join them.
    assert 10 <= stats.fsyncs <= 20


def test_a_lone_record_waits_at_most_about_the_interval(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.01)
    seq = writer.append(b"lone")
    assert writer.wait_durable(seq, timeout=30)
    assert writer.durable_seq == seq
    writer.close()


def test_a_record_after_a_quiet_spell_is_flushed_at_once(tmp_path: Path) -> None:
    # No group was taken for longer than the interval (none at all here): waiting out a
    # window would only delay the record, so it is written and flushed when it comes.
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=600.0, lazy_interval_s=600.0)
    seq = writer.append(b"first")
    assert writer.wait_durable(seq, timeout=30)
    writer.close()
    assert writer.stats().fsyncs == 1


def test_groups_are_at_least_the_interval_apart(tmp_path: Path) -> None:
    interval = 2.0
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=interval, lazy_interval_s=600.0)
    first = writer.append(payload(0))
    assert writer.wait_durable(first, timeout=30)
    flushed_first = time.monotonic()
    # Records coming within the interval of the first group gather into one group,
    # taken once the interval since the first group has passed.
    seqs = [writer.append(payload(seq)) for seq in range(1, 10)]
    assert not writer.wait_durable(seqs[-1], timeout=interval / 4)
    assert writer.wait_durable(seqs[-1], timeout=30)
    waited = time.monotonic() - flushed_first
    stats = writer.stats()
    writer.close()
    assert stats.fsyncs == 2
    # The second group was taken an interval after the first was (which is before
    # the first was durable), then written: allow for the first flush's own time.
    assert waited >= interval - 0.5, waited
    assert [r.seq for r in read_journal(tmp_path).records] == list(range(10))


def test_lazy_records_ride_on_the_next_group_in_order(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.01, lazy_interval_s=600.0)
    lazy = [writer.append(payload(seq), lazy=True) for seq in range(3)]
    # No group is open: the lazy records wait (far longer than this) for one.
    assert not writer.wait_durable(lazy[-1], timeout=0.2)
    assert writer.stats().fsyncs == 0
    seq = writer.append(payload(3))
    assert writer.wait_durable(seq, timeout=30)
    stats = writer.stats()
    writer.close()
    # One fsync for the four: the lazy ones went out first, in the non-lazy one's group.
    assert stats.fsyncs == 1 and stats.durable_seq == 3
    assert [r.seq for r in read_journal(tmp_path).records] == [0, 1, 2, 3]


def test_a_lazy_record_alone_is_flushed_after_its_interval(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0, lazy_interval_s=0.05)
    seq = writer.append(payload(0), lazy=True)
    assert writer.wait_durable(seq, timeout=30)
    writer.close()
    assert [r.seq for r in read_journal(tmp_path).records] == [0]


def test_rotate_and_close_flush_lazy_records(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0, lazy_interval_s=600.0)
    first = writer.append(payload(0), lazy=True)
    assert writer.rotate() == first + 1
    assert writer.durable_seq == first
    writer.append(payload(1), lazy=True)
    writer.close()
    assert [r.seq for r in read_journal(tmp_path).records] == [0, 1]


def test_until_durable_resolves_on_the_event_loop(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.01)

    async def main() -> None:
        seqs = [writer.append(payload(i)) for i in range(20)]
        await asyncio.wait_for(writer.until_durable(seqs[-1]), timeout=30)
        assert writer.durable_seq >= seqs[-1]
        await writer.until_durable(seqs[0])  # already durable: returns at once

    asyncio.run(main())
    writer.close()


def test_rotate_then_drop_through_keeps_only_uncovered_segments(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0)
    for seq in range(4):
        writer.append(payload(seq))
    assert writer.rotate() == 4
    for seq in range(4, 7):
        writer.append(payload(seq))
    assert writer.rotate() == 7
    assert [first for first, _ in list_segments(tmp_path)] == [0, 4, 7]
    assert writer.drop_through(5) == [tmp_path / segment_name(0)]
    assert writer.drop_through(6) == [tmp_path / segment_name(4)]
    # The current segment is never dropped, even when empty and covered.
    assert writer.drop_through(100) == []
    writer.append(payload(7))
    writer.close()
    replay = read_journal(tmp_path)
    assert [r.seq for r in replay.records] == [7] and replay.damage is None


def test_rotating_a_segment_without_records_keeps_it(tmp_path: Path) -> None:
    # Two snapshots with no record between them rotate twice at the same seq.
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0)
    writer.append(payload(0))
    assert writer.rotate() == 1
    assert writer.rotate() == 1
    writer.append(payload(1))
    writer.close()
    assert [first for first, _ in list_segments(tmp_path)] == [0, 1]
    assert [r.seq for r in read_journal(tmp_path).records] == [0, 1]


def test_a_failed_write_stops_the_writer_and_every_waiter(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0)
    writer.wait_durable(writer.append(b"kept"), timeout=30)
    assert writer._fd is not None
    os.close(writer._fd)  # the next write gets EBADF, as a lost disk would give EIO
    seq = writer.append(b"lost")
    with pytest.raises(JournalWriteError, match="cannot write records after 0"):
        writer.wait_durable(seq, timeout=30)
    with pytest.raises(JournalWriteError):
        writer.append(b"refused")
    writer._fd = None
    with pytest.raises(JournalWriteError):
        writer.close()
    assert [r.payload for r in read_journal(tmp_path).records] == [b"kept"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=12),
    cut_fraction=st.floats(min_value=0.0, max_value=1.0),
    flip=st.booleans(),
)
def test_any_cut_or_flipped_byte_leaves_a_verified_prefix(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut_fraction: float, flip: bool
) -> None:
    journal = tmp_path_factory.mktemp("journal")
    writer, _ = JournalWriter.open(journal, commit_interval_s=0.0)
    written = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    for item in written:
        writer.append(item)
    writer.wait_durable(len(written) - 1, timeout=30)
    writer.close()
    ((_, segment),) = list_segments(journal)
    data = bytearray(segment.read_bytes())
    position = SEGMENT_HEADER_BYTES + int(cut_fraction * (len(data) - SEGMENT_HEADER_BYTES - 1))
    if flip:
        data[position] ^= 0x5A
    else:
        del data[position:]
    segment.write_bytes(bytes(data))

    replay = read_journal(journal)
    kept = [r.payload for r in replay.records]
    assert kept == written[: len(kept)]
    assert replay.next_seq == len(kept)
    # Every cut loses the record it falls in; every flipped byte is caught by the CRC.
    assert len(kept) < len(written)
    assert replay.damage is not None or not flip
    repair = repair_journal(journal)
    assert [r.payload for r in read_journal(journal).records] == kept
    assert read_journal(journal).damage is None
    assert repair.replay.next_seq == len(kept)


def test_a_writer_that_wrote_nothing_leaves_no_segment_to_trip_on(tmp_path: Path) -> None:
    write_records(tmp_path, range(0, 2)).close()
    for _ in range(3):
        JournalWriter.open(tmp_path)[0].close()
    writer = write_records(tmp_path, range(2, 3))
    writer.close()
    assert [first for first, _ in list_segments(tmp_path)] == [0, 2]
    assert [r.seq for r in read_journal(tmp_path).records] == [0, 1, 2]
    with pytest.raises(JournalFormatError, match="holds records"):
        JournalWriter(tmp_path, first_seq=2)


def test_append_many_queues_a_batch_in_order_as_one_group(tmp_path: Path) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.05)
    assert writer.append_many([]) == range(0, 0)
    first = writer.append(b"before")
    assert writer.wait_durable(first, timeout=30)
    seqs = writer.append_many([b"a", b"b", b""])
    assert first == 0 and seqs == range(1, 4)
    assert writer.wait_durable(seqs[-1], timeout=30)
    stats = writer.stats()
    writer.close()
    assert stats.fsyncs == 2  # the first record's group, then the batch's one
    assert stats.bytes_written == 4 * RECORD_HEADER_BYTES + len(b"beforeab")
    records = read_journal(tmp_path).records
    assert [(r.seq, r.payload) for r in records] == [
        (0, b"before"),
        (1, b"a"),
        (2, b"b"),
        (3, b""),
    ]


def test_a_payload_that_is_not_bytes_or_too_large_is_refused_before_anything_is_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0)
    with pytest.raises(TypeError, match="record 1 of 2 is a str, not bytes"):
        writer.append_many([b"fine", "text"])  # type: ignore[list-item]
    monkeypatch.setattr(journal_writer, "MAX_RECORD_BYTES", 4)
    with pytest.raises(ValueError, match="record 0 of 1 is 5 bytes, more than a record may hold"):
        writer.append(b"12345")
    # Nothing of either call was queued, and the writer goes on.
    assert writer.wait_durable(writer.append(b"1234"), timeout=30)
    writer.close()
    assert [(r.seq, r.payload) for r in read_journal(tmp_path).records] == [(0, b"1234")]


def test_a_failed_flush_cuts_the_segment_back_to_its_last_durable_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = JournalWriter.open(tmp_path, commit_interval_s=0.0)
    for seq in range(2):  # two groups: the segment's size is its header and both
        assert writer.wait_durable(writer.append(payload(seq)), timeout=30)
    synced = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    lost = writer.append(payload(2, size=4000))
    with pytest.raises(JournalWriteError, match="after 1"):
        writer.wait_durable(lost, timeout=30)
    monkeypatch.setattr(os, "fsync", synced)
    with pytest.raises(JournalWriteError):
        writer.close()
    replay = read_journal(tmp_path)
    # The written but unflushed group was cut off: no torn tail, the two records whole.
    assert replay.damage is None and [r.seq for r in replay.records] == [0, 1]
    (segment,) = tmp_path.glob("*.journal")
    assert segment.stat().st_size == SEGMENT_HEADER_BYTES + 2 * (RECORD_HEADER_BYTES + 40)


def test_a_lone_segment_torn_in_its_creation_keeps_the_numbering_its_name_gives(
    tmp_path: Path,
) -> None:
    # A snapshot covered records 0-25: rotated to segment 26, dropped the older ones.
    # A start reopened the journal (segment 26 held no record: removed and created
    # again) and was killed between the file's creation and its header. The next
    # start numbered from 0 (the snapshot's seal_journal_seq is 26: replay skipped its
    # seals), and the start after it could not open the journal at all (segment 0
    # exists: FileExistsError; chaos seed 177, 20 kills, under load).
    write_records(tmp_path, range(0, 26)).close()
    writer, _ = JournalWriter.open(tmp_path)
    writer.rotate()
    writer.drop_through(25)
    writer.close()
    ((first, path),) = list_segments(tmp_path)
    assert first == 26
    path.write_bytes(b"")  # created, killed before its header was written
    assert read_journal(tmp_path).next_seq == 26
    for _ in range(2):
        writer = write_records(tmp_path, range(26, 28) if _ == 0 else range(28, 29))
        writer.close()
    replay = read_journal(tmp_path)
    assert [r.seq for r in replay.records] == [26, 27, 28] and replay.damage is None
