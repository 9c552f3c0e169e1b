"""Appending to a record journal with group commit, on a writer thread.

:class:`JournalWriter` takes records from any thread without blocking (the
caller may be inside a mutation section of the cut) and hands them to one
writer thread. That thread writes every record queued so far in one
``write`` and flushes them with one ``fsync``: a group commit. Groups are
at least ``commit_interval_s`` apart: a group's first record is written at
once when the previous group was taken that long ago or more, and otherwise
waits, gathering records, until it was (or until ``commit_max_records`` are
queued). So a stream of seals costs at most one flush per interval, a seal
after a quiet spell (the GRPO recipe's generation batch, a call each) is
flushed at once instead of waiting out a window no other record would join,
and no record waits longer than the interval. A record is
handed over as its payload's bytes (:meth:`JournalWriter.append`,
:meth:`JournalWriter.append_many`), encoded by the caller: the writer thread
only frames, writes and flushes, most of it in C and syscalls that release
the GIL, so it takes little of the caller's interpreter. A record is
*durable* once its group's ``fsync`` returned: :attr:`JournalWriter.durable_seq`
and :meth:`JournalWriter.wait_durable` / :meth:`JournalWriter.until_durable`
say so.

A record may be appended *lazily* (``lazy=True``): it does not open a group
of its own but rides on the next group a non-lazy record opens, or on a
rotation or the close, and is flushed on its own only once it has waited
``lazy_interval_s``. Records are still written in sequence order and a
group's ``fsync`` makes every record up to its last one durable, so a lazy
record never lets a later record become durable before it; it only stays
undurable longer. For records no caller waits on (what a crash may lose of
them costs nothing but a count), it saves the ``fsync`` they would start.

Each writer starts a new segment (it never appends to a segment a dead
process may have torn), after :func:`repair_journal` has cut off what a
crash left half-written. :meth:`JournalWriter.rotate` starts a new segment
on purpose (after a snapshot that covers the records so far), and
:meth:`JournalWriter.drop_through` deletes the segments whose every record a
snapshot covers, oldest first, so the journal on disk is always a chain.

A failed write or flush stops the writer: the bytes after the last durable
record are cut off, every waiter and every later ``append`` gets the
:class:`JournalWriteError`, and nothing is ever written after a missing
record.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rollvault.durable.faults import fault_point
from rollvault.durable.fsync import _fsync_directory, _write_all
from rollvault.durable.journal_format import (
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    JournalDamage,
    JournalFormatError,
    JournalReplay,
    frame_record,
    list_segments,
    read_journal,
    segment_header,
    segment_name,
)

DEFAULT_COMMIT_INTERVAL_S: Final = 0.02
DEFAULT_COMMIT_MAX_RECORDS: Final = 512
DEFAULT_LAZY_INTERVAL_S: Final = 1.0
"""How long a lazy record waits for a group to ride on before it is flushed on its own."""
QUARANTINE_SUFFIX: Final = ".damaged"


class JournalWriteError(OSError):
    """The journal could not write or flush a record; it takes no more."""


_HEADER_SPACE: Final = bytes(RECORD_HEADER_BYTES)


@dataclass(frozen=True, slots=True)
class JournalRepair:
    """What :func:`repair_journal` found and cut off before a writer starts."""

    replay: JournalReplay
    truncated: JournalDamage | None
    """The damaged segment, cut back to its last verified record (None: no damage)."""
    quarantined: list[Path]
    """Segments after the damage, renamed with :data:`QUARANTINE_SUFFIX` (never replayed)."""


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counters of one writer, for the run's metrics."""

    appended_seq: int
    """Highest sequence number handed to :meth:`JournalWriter.append` (first - 1: none)."""
    durable_seq: int
    """Highest sequence number flushed to disk: every record up to it is kept."""
    fsyncs: int
    bytes_written: int


def repair_journal(directory: Path) -> JournalRepair:
    """Read ``directory``'s journal and cut off what follows its first damaged record."""
    replay = read_journal(directory)
    damage = replay.damage
    if damage is not None:
        with open(damage.segment, "r+b") as handle:
            # A segment whose header itself is damaged is emptied: the next
            # writer starts its own segment at the sequence number after the
            # last verified record, so an empty file never joins the chain.
            handle.truncate(_good_bytes(replay, damage))
            os.fsync(handle.fileno())
        fault_point("journal.repair_truncated")
    quarantined = []
    for path in replay.unread_segments:
        target = path.with_name(path.name + QUARANTINE_SUFFIX)
        os.replace(path, target)
        quarantined.append(target)
    if damage is not None or quarantined:
        _fsync_directory(directory)
    return JournalRepair(replay, damage, quarantined)


def check_payloads(directory: Path, payloads: Sequence[bytes]) -> None:
    """Refuse, before anything is queued, a batch with a record a journal cannot hold.

    The caller decides what a record that cannot be journaled means (the seal
    journal stops).
    """
    for number, payload in enumerate(payloads):
        if type(payload) is not bytes:
            raise TypeError(
                f"journal {directory}: record {number} of {len(payloads)} is a "
                f"{type(payload).__name__}, not bytes"
            )
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(
                f"journal {directory}: record {number} of {len(payloads)} is "
                f"{len(payload)} bytes, more than a record may hold ({MAX_RECORD_BYTES})"
            )


def _without_empty_tail(
    directory: Path, segments: list[tuple[int, Path]], first_seq: int
) -> list[tuple[int, Path]]:
    """Remove a last segment that starts at ``first_seq``: it can hold no record.

    A writer that closed before its first record, or a repair that cut a
    segment back to its header, leaves one; the new writer's segment takes
    its name.
    """
    if not segments or segments[-1][0] != first_seq:
        return segments
    path = segments[-1][1]
    if path.stat().st_size > SEGMENT_HEADER_BYTES:
        raise JournalFormatError(
            f"{path}: holds records, yet a writer was asked to start a segment at "
            f"record {first_seq}; open the journal with JournalWriter.open"
        )
    path.unlink()
    _fsync_directory(directory)
    return segments[:-1]


def _good_bytes(replay: JournalReplay, damage: JournalDamage) -> int:
    scan = next(scan for scan in replay.segments if scan.path == damage.segment)
    return scan.good_bytes


class JournalWriter:
    """Appends records to the journal in ``directory`` on its own writer thread."""

    def __init__(
        self,
        directory: Path,
        *,
        first_seq: int,
        commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
        commit_max_records: int = DEFAULT_COMMIT_MAX_RECORDS,
        lazy_interval_s: float = DEFAULT_LAZY_INTERVAL_S,
        on_commit: Callable[[JournalStats, JournalWriteError | None], None] | None = None,
    ) -> None:
        if commit_interval_s < 0 or commit_max_records < 1 or lazy_interval_s < 0:
            raise ValueError(
                f"journal {directory}: commit_interval_s and lazy_interval_s must be >= 0 and "
                f"commit_max_records >= 1 (got {commit_interval_s}, {lazy_interval_s}, "
                f"{commit_max_records})"
            )
        self.directory = directory
        self._interval = commit_interval_s
        self._lazy_interval = lazy_interval_s
        self._max_records = commit_max_records
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, bytes, bool]] = deque()
        """(seq, payload, lazy) of each record not yet written."""
        self._first_queued_at = 0.0
        """When the oldest queued record was queued (a lazy one's wait starts there)."""
        self._group_open = False
        """Whether a non-lazy record is queued (else only lazy ones are, or none)."""
        self._last_group_at = -math.inf
        """When the writer last took a group: the next one is taken an interval later at
        the earliest."""
        self._next_seq = first_seq
        self._durable_seq = first_seq - 1
        self._rotate_requested = False
        self._closing = False
        self._failure: JournalWriteError | None = None
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._fsyncs = 0
        self._bytes = 0
        self._on_commit = on_commit
        """Told, on the writer thread, of every group made durable and of the failure
        (a writer in another process publishes them to its parent this way)."""
        self._segments = _without_empty_tail(directory, list_segments(directory), first_seq)
        self._segment_size = 0
        """Bytes of the open segment: its header and every group written to it."""
        self._fd: int | None = self._new_segment(first_seq)
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
        commit_max_records: int = DEFAULT_COMMIT_MAX_RECORDS,
        lazy_interval_s: float = DEFAULT_LAZY_INTERVAL_S,
    ) -> tuple[JournalWriter, JournalRepair]:
        """Repair ``directory``'s journal, then start writing after its last verified record."""
        directory.mkdir(parents=True, exist_ok=True)
        repair = repair_journal(directory)
        writer = cls(
            directory,
            first_seq=repair.replay.next_seq,
            commit_interval_s=commit_interval_s,
            commit_max_records=commit_max_records,
            lazy_interval_s=lazy_interval_s,
        )
        return writer, repair

    # -- the caller's side -------------------------------------------------

    def append(self, payload: bytes, *, lazy: bool = False) -> int:
        """Queue one record; returns its sequence number (durable later, see above).

        ``lazy``: the record opens no group; it rides on the next one (see above).
        """
        return self._enqueue([payload], lazy)[0]

    def append_many(self, payloads: Sequence[bytes], *, lazy: bool = False) -> range:
        """Queue records as :meth:`append` does, in order, under one lock: their seqs.

        A batch of records costs the caller one lock round trip and at most one
        wake of the writer, not one per record.
        """
        return self._enqueue(payloads, lazy)

    def _enqueue(self, payloads: Sequence[bytes], lazy: bool) -> range:
        check_payloads(self.directory, payloads)
        with self._cond:
            self._raise_if_stopped()
            first = self._next_seq
            if not payloads:
                return range(first, first)
            self._next_seq += len(payloads)
            wake = not self._queue or len(self._queue) + len(payloads) >= self._max_records
            if not self._queue:
                self._first_queued_at = time.monotonic()
            if not lazy and not self._group_open:
                self._group_open = True
                wake = True
            self._queue.extend(
                (seq, payload, lazy) for seq, payload in enumerate(payloads, start=first)
            )
            # The writer thread waits for a group's first record (or a lazy record's
            # deadline), then for the interval to end or the group to fill: waking it
            # for every record in between would only hand it the GIL to go back to sleep.
            if wake:
                self._cond.notify_all()
            return range(first, self._next_seq)

    @property
    def durable_seq(self) -> int:
        """Every record up to this sequence number is on disk."""
        with self._cond:
            return self._durable_seq

    @property
    def failure(self) -> JournalWriteError | None:
        """Why the writer stopped (None: it has not failed)."""
        with self._cond:
            return self._failure

    def stats(self) -> JournalStats:
        with self._cond:
            return self._stats()

    def _stats(self) -> JournalStats:
        return JournalStats(self._next_seq - 1, self._durable_seq, self._fsyncs, self._bytes)

    def wait_durable(self, seq: int, timeout: float | None = None) -> bool:
        """Block until record ``seq`` is durable (False on timeout); raises if the writer failed."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._durable_seq >= seq or self._failure is not None, timeout
            )
            if self._failure is not None and self._durable_seq < seq:
                raise self._failure
            return done

    async def until_durable(self, seq: int) -> None:
        """Wait, without blocking the event loop, until record ``seq`` is durable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._durable_seq >= seq:
                return
            if self._failure is not None:
                raise self._failure
            self._async_waiters.append((seq, loop, future))
        await future

    def rotate(self) -> int:
        """Flush what is queued and start a new segment; returns the new segment's first seq.

        Call it once a snapshot covers every record so far: the segments
        before the new one can then go with :meth:`drop_through`.
        """
        with self._cond:
            self._raise_if_stopped()
            self._rotate_requested = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._rotate_requested or self._failure is not None)
            if self._failure is not None:
                raise self._failure
            return self._segments[-1][0]

    def drop_through(self, seq: int) -> list[Path]:
        """Delete the segments (never the current one) whose records all have seq <= ``seq``."""
        with self._cond:
            segments = list(self._segments)
        dropped = []
        for (_, path), (next_first, _) in zip(segments, segments[1:], strict=False):
            if next_first - 1 > seq:
                break
            path.unlink()
            fault_point("journal.segment_dropped")
            dropped.append(path)
        if dropped:
            _fsync_directory(self.directory)
            with self._cond:
                self._segments = self._segments[len(dropped) :]
        return dropped

    def close(self) -> None:
        """Flush every queued record, stop the thread and close the segment."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with self._cond:
            if self._failure is not None:
                raise self._failure

    def _raise_if_stopped(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise ValueError(f"journal {self.directory}: the writer was closed")

    # -- the writer thread -------------------------------------------------

    def _run(self) -> None:
        while True:
            batch, rotate, closing = self._next_batch()
            try:
                if batch:
                    self._write_group(batch)
                if rotate:
                    self._rotate_segment()
            except OSError as exc:
                self._fail(exc)
                return
            with self._cond:
                if rotate:
                    self._rotate_requested = False
                self._cond.notify_all()
            if closing and not batch:
                return

    def _next_batch(self) -> tuple[list[tuple[int, bytes, bool]], bool, bool]:
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._rotate_requested or self._closing)
            # Group commit: gather records until the interval since the previous group
            # ends (at once if it already has), the oldest lazy record has waited its
            # interval, or the group is full.
            while (
                len(self._queue) < self._max_records
                and not (self._rotate_requested or self._closing)
                and (left := self._group_deadline() - time.monotonic()) > 0
            ):
                self._cond.wait(left)
            take = min(len(self._queue), self._max_records)
            batch = [self._queue.popleft() for _ in range(take)]
            self._group_open = False
            if batch:
                self._last_group_at = time.monotonic()
            if self._queue:
                # Only past a full group: what is left waits again from now.
                self._first_queued_at = self._last_group_at
                if not all(lazy for _, _, lazy in self._queue):
                    self._group_open = True
            return batch, self._rotate_requested and not self._queue, self._closing

    def _group_deadline(self) -> float:
        """When the queued records are written (call with the condition held)."""
        deadline = self._first_queued_at + self._lazy_interval
        if self._group_open:
            # Never later than an interval after the group opened: the previous group
            # was taken before that.
            deadline = min(deadline, self._last_group_at + self._interval)
        return deadline

    def _write_group(self, batch: list[tuple[int, bytes, bool]]) -> None:
        fd = self._require_fd()
        data = self._frame_group(batch)
        # Known, not asked with fstat: a syscall that releases the GIL costs a hand-back
        # from the event loop, and only this thread writes the segment it created.
        size = self._segment_size
        try:
            _write_buffer(fd, data)
            fault_point("journal.records_written")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)
            raise
        self._segment_size = size + len(data)
        fault_point("journal.records_synced")
        with self._cond:
            self._fsyncs += 1
            self._bytes += len(data)
            self._durable_seq = batch[-1][0]
            self._wake_async_waiters()
            stats = self._stats()
        if self._on_commit is not None:
            self._on_commit(stats, None)

    def _frame_group(self, batch: list[tuple[int, bytes, bool]]) -> bytearray:
        """The group's records, framed, in one buffer."""
        buffer = bytearray()
        for seq, payload, _ in batch:
            start = len(buffer)
            buffer += _HEADER_SPACE
            buffer += payload
            frame_record(buffer, start, seq)
        return buffer

    def _rotate_segment(self) -> None:
        with self._cond:
            first_seq = self._durable_seq + 1
            if self._segments and self._segments[-1][0] == first_seq:
                # Nothing was written since the segment opened (two snapshots
                # with no record between them): it already starts here.
                return
        os.close(self._require_fd())
        self._fd = None
        self._fd = self._new_segment(first_seq)

    def _new_segment(self, first_seq: int) -> int:
        path = self.directory / segment_name(first_seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            header = segment_header(first_seq)
            _write_all(fd, header)
            self._segment_size = len(header)
            os.fsync(fd)
            fault_point("journal.segment_created")
            _fsync_directory(self.directory)
        except OSError:
            os.close(fd)
            raise
        fault_point("journal.segment_dir_synced")
        with self._cond:
            self._segments.append((first_seq, path))
        return fd

    def _require_fd(self) -> int:
        if self._fd is None:
            raise JournalWriteError(f"journal {self.directory}: no segment open")
        return self._fd

    def _fail(self, exc: OSError) -> None:
        with self._cond:
            self._failure = JournalWriteError(
                f"journal {self.directory}: cannot write records after "
                f"{self._durable_seq}: {exc.strerror or exc}"
            )
            self._failure.__cause__ = exc
            self._cond.notify_all()
            self._wake_async_waiters()
            stats, failure = self._stats(), self._failure
        if self._on_commit is not None:
            self._on_commit(stats, failure)

    def _wake_async_waiters(self) -> None:
        """Resolve the event-loop waiters the last commit (or failure) settles."""
        pending = []
        for seq, loop, future in self._async_waiters:
            if seq <= self._durable_seq:
                loop.call_soon_threadsafe(_settle, future, None)
            elif self._failure is not None:
                loop.call_soon_threadsafe(_settle, future, self._failure)
            else:
                pending.append((seq, loop, future))
        self._async_waiters = pending


def _write_buffer(fd: int, data: bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
