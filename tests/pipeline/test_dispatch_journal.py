"""The dispatch journal: lines, segments, seq across starts, torn lines, pruning."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest

from rollvault.controller.loop.dispatch_journal import (
    DispatchedLine,
    DispatchJournal,
    ReturnedLine,
    journal_segments,
    read_dispatch_journal,
    read_segment,
)


def hexes(count: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(count)]


def dispatch(journal: DispatchJournal, group_id: str, attempts: list[str]) -> None:
    journal.dispatched(
        group_id=group_id, epoch=1, dataset_idx=7, attempts=list(enumerate(attempts))
    )


def test_lines_are_numbered_across_starts_and_each_start_writes_its_own_segment(
    tmp_path: Path,
) -> None:
    first = DispatchJournal(tmp_path)
    assert first.seq == 0 and journal_segments(tmp_path) == []  # nothing until a line
    a, b = hexes(2)
    dispatch(first, "g", [a, b])
    first.returned(a)
    first.close()
    second = DispatchJournal(tmp_path)
    assert second.seq == 2
    c = hexes(1)[0]
    dispatch(second, "h", [c])
    second.close()
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [1, 3]
    tail = read_dispatch_journal(tmp_path, after_seq=0)
    assert [(line.seq, line.group_id) for line in tail.dispatched] == [(1, "g"), (3, "h")]
    assert [attempt.attempt_uuid for attempt in tail.dispatched[0].attempts] == [a, b]
    assert (tail.dispatched[0].epoch, tail.dispatched[0].dataset_idx) == (1, 7)
    assert tail.returned == {a}


def test_a_snapshot_position_selects_the_rounds_after_it_but_every_return(
    tmp_path: Path,
) -> None:
    journal = DispatchJournal(tmp_path)
    a, b = hexes(2)
    dispatch(journal, "g", [a])  # seq 1
    journal.returned(a)  # seq 2
    dispatch(journal, "g", [b])  # seq 3
    journal.close()
    tail = read_dispatch_journal(tmp_path, after_seq=2)
    assert [line.seq for line in tail.dispatched] == [3]
    # A return before the snapshot still counts: a cancelled attempt stays dispatched in it.
    assert tail.returned == {a}


def test_a_torn_last_line_is_dropped_and_a_segment_holding_only_one_is_removed(
    tmp_path: Path,
) -> None:
    journal = DispatchJournal(tmp_path)
    a, b = hexes(2)
    dispatch(journal, "g", [a])
    journal.returned(a)
    journal.close()
    ((_, path),) = journal_segments(tmp_path)
    with open(path, "ab") as handle:
        handle.write(b'{"type":"dispatched","seq":3,"grou')  # killed mid-write
    assert [type(line) for line in read_segment(path)] == [DispatchedLine, ReturnedLine]
    (tmp_path / "segment_000000000003.jsonl").write_bytes(b'{"type":"ret')
    restarted = DispatchJournal(tmp_path)
    assert restarted.seq == 2
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [1]
    dispatch(restarted, "g", [b])  # the freed name is the new segment's
    restarted.close()
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [1, 3]


def test_a_damaged_line_is_reported_and_ends_its_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = DispatchJournal(tmp_path)
    a, b = hexes(2)
    dispatch(journal, "g", [a])
    dispatch(journal, "g", [b])
    journal.close()
    ((_, path),) = journal_segments(tmp_path)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"{not json", lines[1], b""]))
    with caplog.at_level(logging.WARNING, logger="rollvault.restore"):
        tail = read_dispatch_journal(tmp_path, after_seq=0)
    assert [line.seq for line in tail.dispatched] == [1]
    assert f"{path}:2: damaged dispatch journal line" in caplog.text


def test_pruning_drops_the_segments_a_snapshot_reflects(tmp_path: Path) -> None:
    journal = DispatchJournal(tmp_path)
    for attempt in hexes(3):
        dispatch(journal, "g", [attempt])  # seq 1..3, one segment
    journal.prune(2)  # line 3 is not reflected: its segment stays
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [1]
    for attempt in hexes(2):
        dispatch(journal, "g", [attempt])  # seq 4..5, a new segment
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [1, 4]
    journal.prune(4)
    assert [first_seq for first_seq, _ in journal_segments(tmp_path)] == [4]
    journal.prune(5)
    assert journal_segments(tmp_path) == []
    assert journal.seq == 5
    dispatch(journal, "g", hexes(1))
    journal.close()
    assert [line.seq for line in read_dispatch_journal(tmp_path, after_seq=0).dispatched] == [6]


def test_a_seal_batch_returns_its_attempts_in_one_write_of_numbered_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = DispatchJournal(tmp_path)
    a, b, c = hexes(3)
    dispatch(journal, "g", [a, b, c])  # seq 1
    writes: list[int] = []
    original = os.write

    def counting(fd: int, data: bytes) -> int:
        writes.append(fd)
        return original(fd, data)

    monkeypatch.setattr(os, "write", counting)
    journal.returned_many([a, b, c])
    journal.returned_many([])  # nothing: no write, no seq
    monkeypatch.undo()
    assert len(writes) == 1 and journal.seq == 4
    journal.close()
    ((_, path),) = journal_segments(tmp_path)
    lines = read_segment(path)
    assert [(line.seq, type(line)) for line in lines] == [
        (1, DispatchedLine),
        (2, ReturnedLine),
        (3, ReturnedLine),
        (4, ReturnedLine),
    ]
    # A kill inside the write leaves the whole lines before the torn one: those still count.
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b'{"type":"returned"') + 20])
    assert read_dispatch_journal(tmp_path, after_seq=0).returned == {a, b}
