"""Append-only line files on a full disk: bounded retries, whole lines, refusal after a loss."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rollvault.controller.loop import append_only_file
from rollvault.controller.loop.append_only_file import AppendOnlyFile
from rollvault.controller.loop.dispatch_journal import DispatchJournal, read_dispatch_journal
from rollvault.controller.loop.io_failures import LogWriteError
from rollvault.controller.loop.run_logs import (
    JsonlWriter,
    LogSequence,
    TrainLogRecord,
    read_jsonl,
)

LINE = b'{"a": "' + b"x" * 100 + b'"}\n'


class DiskOutage:
    """Replaces ``os.write`` in the module: the first call of each line may write half of
    it, then calls fail with ``errno_`` until ``failures`` have been raised."""

    def __init__(self, failures: int, *, errno_: int = errno.ENOSPC, half_first: bool = True):
        self.failures = failures
        self.errno = errno_
        self.half_first = half_first
        self.calls = 0
        self.raised = 0
        self._real = os.write

    def __call__(self, fd: int, data: memoryview | bytes) -> int:
        self.calls += 1
        if self.raised >= self.failures:
            return self._real(fd, data)
        if self.half_first and self.calls % 2 == 1:
            return self._real(fd, bytes(data)[: len(data) // 2])
        self.raised += 1
        raise OSError(self.errno, os.strerror(self.errno))


def test_a_short_outage_is_ridden_out_and_leaves_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    file = AppendOnlyFile(path)
    file.append(LINE)
    outage = DiskOutage(failures=3)
    monkeypatch.setattr(append_only_file.os, "write", outage)
    file.append(LINE)
    file.append(LINE)
    file.close()
    assert outage.raised == 3
    assert path.read_bytes() == LINE * 3  # the half-written attempts were cut off


def test_a_lasting_outage_cuts_the_line_off_and_refuses_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    file = AppendOnlyFile(path)
    file.append(LINE)
    monkeypatch.setattr(append_only_file, "SPACE_RETRY_BUDGET_S", 0.05)
    outage = DiskOutage(failures=10**9)
    monkeypatch.setattr(append_only_file.os, "write", outage)
    with pytest.raises(LogWriteError, match=r"log\.jsonl: No space left on device \(still after"):
        file.append(LINE)
    assert outage.raised > 1  # retried within the budget
    monkeypatch.undo()  # the disk has room again, but a line is missing: nothing may follow it
    with pytest.raises(LogWriteError, match="No space left on device"):
        file.append(LINE)
    file.close()
    assert path.read_bytes() == LINE


def test_an_error_that_is_not_about_space_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = AppendOnlyFile(tmp_path / "log.jsonl")
    outage = DiskOutage(failures=10**9, errno_=errno.EIO, half_first=False)
    monkeypatch.setattr(append_only_file.os, "write", outage)
    with pytest.raises(LogWriteError, match="Input/output error$"):
        file.append(LINE)
    assert outage.calls == 1
    file.close()


def _fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte with one file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return filler


def _record(step: int) -> TrainLogRecord:
    return TrainLogRecord(
        step=step,
        trainer_version=step,
        group_id=f"g{step}",
        sample_id=str(step),
        epoch=0,
        rewards=[1.0],
        gate_rollout_ids=[f"g{step}_g0_a00"],
        target_step=step,
        incarnation=1,
    )


def test_on_a_full_filesystem_a_log_line_waits_for_space_freed_meanwhile(
    small_filesystem: Callable[[int], Path],
) -> None:
    directory = small_filesystem(64 << 10)
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(directory / "train.jsonl", LogSequence())
    writer.write(_record(0))
    filler = _fill(directory)
    # Like a failing snapshot removing its partial files a moment later.
    threading.Timer(0.1, filler.unlink).start()
    for step in range(1, 40):
        writer.write(_record(step))
    writer.close()
    assert [r.step for r in read_jsonl(directory / "train.jsonl", TrainLogRecord)] == list(
        range(40)
    )


def test_on_a_filesystem_that_stays_full_the_log_stops_with_whole_lines(
    small_filesystem: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(append_only_file, "SPACE_RETRY_BUDGET_S", 0.1)
    directory = small_filesystem(64 << 10)
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(directory / "train.jsonl", LogSequence())
    for step in range(3):
        writer.write(_record(step))
    filler = _fill(directory)
    with pytest.raises(LogWriteError, match="train.jsonl: No space left on device") as raised:
        for step in range(3, 10_000):
            writer.write(_record(step))
    assert writer.failure is raised.value
    written = read_jsonl(directory / "train.jsonl", TrainLogRecord)
    assert [r.step for r in written] == list(range(len(written))) and len(written) >= 3
    assert (directory / "train.jsonl").read_bytes().endswith(b"\n")  # no partial line
    filler.unlink()
    with pytest.raises(LogWriteError):
        writer.write(_record(10_000))
    writer.close()
    assert read_jsonl(directory / "train.jsonl", TrainLogRecord) == written


def test_the_journal_refuses_lines_after_one_it_could_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = DispatchJournal(tmp_path)
    first = uuid.uuid4().hex
    journal.dispatched(group_id="g", epoch=0, dataset_idx=3, attempts=[(0, first)])
    monkeypatch.setattr(append_only_file, "SPACE_RETRY_BUDGET_S", 0.02)
    monkeypatch.setattr(append_only_file.os, "write", DiskOutage(failures=10**9))
    with pytest.raises(LogWriteError, match="segment_000000000001.jsonl: No space left"):
        journal.returned(first)
    monkeypatch.undo()
    assert journal.failure is not None and journal.seq == 1
    with pytest.raises(LogWriteError):
        journal.dispatched(group_id="h", epoch=0, dataset_idx=4, attempts=[(0, first)])
    journal.close()
    tail = read_dispatch_journal(tmp_path, after_seq=0)
    assert [line.seq for line in tail.dispatched] == [1] and tail.returned == frozenset()
