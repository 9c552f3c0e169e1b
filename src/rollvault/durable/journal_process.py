"""The journal's writer in a child process: the caller's interpreter does none of its work.

:class:`JournalProcessWriter` offers :class:`~rollvault.durable.journal_writer.JournalWriter`'s
interface, and a ``JournalWriter`` does the work, in a child process of its
own (``python -m rollvault.durable.journal_process``: a fresh interpreter
that imports the durable layer alone). The caller only hands each batch of
records' bytes to a pipe (one ``write``) and reads the durable sequence
number from memory the child shares. Why a process: in the caller's process
the writer thread frames, CRCs, writes and flushes under the same GIL as the
event loop that appends, and every one of its GIL-releasing calls ends with a
hand-back the loop is forced to make (see BENCHMARKS.md, "Issue 16"); a child
has an interpreter of its own.

Durability is the thread's: a record is durable once the child's group
``fsync`` returned, and the child publishes the sequence number after that.
The child lives only as long as its parent: the parent's death closes the
command pipe, and the child then exits at once without writing what it still
holds, as a killed process's writer thread does, so that a restarted run's
repair never races a writer left over from the run that was killed. Records
are handed over in order on one pipe, so a rotation, a drop or a close acts
after every record appended before it, as with the thread.

Bytes, never objects, cross the pipes: msgpack-encoded msgspec Structs,
decoded strictly.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import mmap
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Final

import msgspec

from rollvault.durable.faults import kill_with
from rollvault.durable.journal_writer import (
    DEFAULT_COMMIT_INTERVAL_S,
    DEFAULT_COMMIT_MAX_RECORDS,
    DEFAULT_LAZY_INTERVAL_S,
    JournalRepair,
    JournalStats,
    JournalWriteError,
    JournalWriter,
    check_payloads,
    repair_journal,
)

START_TIMEOUT_S: Final = 60.0
"""How long the child may take to start and open its segment."""
STOP_TIMEOUT_S: Final = 30.0
"""How long a closing child may take to flush and exit before it is killed."""
PIPE_BYTES: Final = 1 << 20
"""The command pipe's capacity asked of Linux: several generation batches' records fit
before an append would wait for the child to read (the default is 64 KiB)."""
_F_SETPIPE_SZ: Final = 1031  # linux/fcntl.h; the fcntl module names it only from 3.12 on

# The shared counters' slots.
_DURABLE, _FSYNCS, _BYTES, _FAILED = range(4)
_COUNTER_BYTES: Final = 4 * 8


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    pass


class _Settings(_Message, frozen=True):
    directory: str
    first_seq: int
    commit_interval_s: float
    commit_max_records: int
    lazy_interval_s: float


class _Append(_Message, frozen=True, tag="append"):
    first_seq: int
    payloads: list[bytes]
    lazy: bool


class _Rotate(_Message, frozen=True, tag="rotate"):
    pass


class _DropThrough(_Message, frozen=True, tag="drop"):
    seq: int


class _WaitDurable(_Message, frozen=True, tag="wait"):
    seq: int
    timeout_s: float | None


class _Describe(_Message, frozen=True, tag="describe"):
    """Ask why the writer failed (the shared failure flag says only that it did)."""


class _Close(_Message, frozen=True, tag="close"):
    pass


class _Done(_Message, frozen=True, tag="done"):
    value: int = 0
    paths: list[str] = []


class _Failed(_Message, frozen=True, tag="failed"):
    message: str


_Command = _Append | _Rotate | _DropThrough | _WaitDurable | _Describe | _Close
_Reply = _Done | _Failed
_ENCODER: Final = msgspec.msgpack.Encoder()
_COMMANDS: Final = msgspec.msgpack.Decoder(_Command)
_REPLIES: Final = msgspec.msgpack.Decoder(_Reply)
_SETTINGS: Final = msgspec.msgpack.Decoder(_Settings)


class JournalProcessWriter:
    """Appends records to the journal in ``directory`` from a child process (see above)."""

    def __init__(
        self,
        directory: Path,
        *,
        first_seq: int,
        commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
        commit_max_records: int = DEFAULT_COMMIT_MAX_RECORDS,
        lazy_interval_s: float = DEFAULT_LAZY_INTERVAL_S,
    ) -> None:
        self.directory = directory
        self._next_seq = first_seq
        self._failure: JournalWriteError | None = None
        self._closed = False
        self._send_lock = threading.Lock()
        """Appends (the event loop) and requests (worker threads) share the command pipe;
        a message larger than a pipe's atomic write must not interleave with another."""
        self._request_lock = threading.Lock()
        """One request waits for its reply at a time: replies come in order, unlabelled."""
        self._counters = _Counters.create()
        self._counters.set(_DURABLE, first_seq - 1)
        child_commands, commands = os.pipe()
        replies, child_replies = os.pipe()
        self._commands = Connection(commands, readable=False)
        self._replies = Connection(replies, writable=False)
        _widen(commands)
        child_fds = (child_commands, child_replies, self._counters.fd)
        try:
            # A fresh interpreter that imports this module alone (~25 MB, ~0.1 s), not the
            # caller's __main__ as multiprocessing's spawn would (torch and all).
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, *map(str, child_fds)],
                stdin=subprocess.DEVNULL,
                pass_fds=child_fds,
                env=_child_environment(),
            )
        finally:
            # Only the child holds its ends: its death is EOF (or EPIPE) at ours.
            os.close(child_commands)
            os.close(child_replies)
        settings = _Settings(
            str(directory), first_seq, commit_interval_s, commit_max_records, lazy_interval_s
        )
        self._send(settings)
        reply = self._receive(START_TIMEOUT_S)
        if isinstance(reply, _Failed):
            self._stop_process()
            raise JournalWriteError(reply.message)

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
        commit_max_records: int = DEFAULT_COMMIT_MAX_RECORDS,
        lazy_interval_s: float = DEFAULT_LAZY_INTERVAL_S,
    ) -> tuple[JournalProcessWriter, JournalRepair]:
        """Repair ``directory``'s journal, then start a child writing after its last good record."""
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

    # -- JournalWriter's interface ------------------------------------------------------

    def append(self, payload: bytes, *, lazy: bool = False) -> int:
        """Hand one record to the child; returns its sequence number (durable later)."""
        return self.append_many([payload], lazy=lazy)[0]

    def append_many(self, payloads: Sequence[bytes], *, lazy: bool = False) -> range:
        """Hand records to the child in order, in one message: their seqs."""
        check_payloads(self.directory, payloads)
        self._raise_if_stopped()
        first = self._next_seq
        if not payloads:
            return range(first, first)
        self._send(_Append(first, list(payloads), lazy))
        self._next_seq += len(payloads)
        return range(first, self._next_seq)

    @property
    def durable_seq(self) -> int:
        """Every record up to this sequence number is on disk."""
        return self._counters.get(_DURABLE)

    @property
    def pid(self) -> int:
        """The writer process's id."""
        return self._process.pid

    def stats(self) -> JournalStats:
        counters = self._counters
        return JournalStats(
            self._next_seq - 1,
            counters.get(_DURABLE),
            counters.get(_FSYNCS),
            counters.get(_BYTES),
        )

    def wait_durable(self, seq: int, timeout: float | None = None) -> bool:
        """Block until record ``seq`` is durable (False on timeout); raises if the writer failed."""
        if self.durable_seq >= seq:
            return True
        return bool(self._request(_WaitDurable(seq, timeout)).value)

    async def until_durable(self, seq: int) -> None:
        """Wait, without blocking the event loop, until record ``seq`` is durable."""
        if self.durable_seq < seq:
            await asyncio.to_thread(self.wait_durable, seq)

    def rotate(self) -> int:
        """Flush what was appended and start a new segment; returns its first seq."""
        return self._request(_Rotate()).value

    def drop_through(self, seq: int) -> list[Path]:
        """Delete the segments (never the current one) whose records all have seq <= ``seq``."""
        return [Path(path) for path in self._request(_DropThrough(seq)).paths]

    def close(self) -> None:
        """Flush every record handed over, stop the child and close the pipes."""
        if self._closed:
            return
        try:
            if self._failure is None:
                self._request(_Close())
        finally:
            self._closed = True
            self._stop_process()
        if self._failure is not None:
            raise self._failure

    # -- the parent's plumbing ----------------------------------------------------------

    def _raise_if_stopped(self) -> None:
        if self._closed:
            raise ValueError(f"journal {self.directory}: the writer was closed")
        if self._failure is None and self._counters.get(_FAILED):
            self._request(_Describe())
        if self._failure is not None:
            raise self._failure

    def _send(self, command: _Command | _Settings) -> None:
        data = _ENCODER.encode(command)
        try:
            with self._send_lock:
                self._commands.send_bytes(data)
        except OSError as exc:
            raise self._lost(exc) from exc

    def _request(self, command: _Command) -> _Done:
        with self._request_lock:
            if self._failure is not None:
                raise self._failure
            self._send(command)
            reply = self._receive(None)
        if isinstance(reply, _Failed):
            self._failure = JournalWriteError(reply.message)
            raise self._failure
        return reply

    def _receive(self, timeout: float | None) -> _Reply:
        try:
            if timeout is not None and not self._replies.poll(timeout):
                raise TimeoutError(f"no answer in {timeout:.0f} s")
            return _REPLIES.decode(self._replies.recv_bytes())
        except (OSError, EOFError, TimeoutError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> JournalWriteError:
        """The child is gone (or mute): the writer takes no more records."""
        if self._failure is None:
            self._failure = JournalWriteError(
                f"journal {self.directory}: the writer process stopped answering "
                f"(exit code {self._process.poll()}); records after "
                f"{self.durable_seq} may not be on disk: {exc!r}"
            )
        return self._failure

    def _stop_process(self) -> None:
        # EOF first: a child that was not told to close (its writer failed) exits at it.
        self._commands.close()
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()  # the child this writer started
            self._process.wait()
        self._replies.close()
        self._counters.close()


class _Counters:
    """Four int64s in memory the parent and the child share (a memfd both map); once
    closed, the values they last held (a closed writer's stats stay readable)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _COUNTER_BYTES)
        self._slots: memoryview | list[int] = memoryview(self._map).cast("q")

    @classmethod
    def create(cls) -> _Counters:
        fd = os.memfd_create("rollvault-journal-counters", os.MFD_CLOEXEC)
        os.ftruncate(fd, _COUNTER_BYTES)
        return cls(fd)

    def get(self, slot: int) -> int:
        return int(self._slots[slot])

    def set(self, slot: int, value: int) -> None:
        self._slots[slot] = value

    def close(self) -> None:
        shared = self._slots
        if isinstance(shared, memoryview):
            self._slots = shared.tolist()
            shared.release()
            self._map.close()
            os.close(self.fd)


def _widen(fd: int) -> None:
    """Ask for a command pipe of :data:`PIPE_BYTES` (Linux; the default is kept elsewhere)."""
    with contextlib.suppress(OSError):  # a smaller pipe only makes appends wait sooner
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)


def _child_environment() -> dict[str, str]:
    """The caller's environment, with its import path: the child imports this module
    wherever the caller found it (a source tree on ``sys.path``, not only an install)."""
    path = [entry for entry in sys.path if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


# -- the child --------------------------------------------------------------------------


def _child_main(argv: list[str]) -> None:
    """The child's entry: ``python -m rollvault.durable.journal_process COMMANDS REPLIES COUNTERS``
    (the file descriptors its parent passed it)."""
    commands, replies, counters = map(int, argv)
    _serve(
        Connection(commands, writable=False),
        Connection(replies, readable=False),
        _Counters(counters),
    )


def _serve(commands: Connection, replies: Connection, counters: _Counters) -> None:
    """The child: a JournalWriter that does what the commands say until told to close."""
    # Only the parent knows when to stop (a Ctrl-C reaches the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kill_with(os.getppid())  # a crash test's kill at a journal fault point kills the run
    try:
        config = _SETTINGS.decode(commands.recv_bytes())
    except (EOFError, OSError):
        return  # the parent died before it said what to write

    def publish(stats: JournalStats, failure: JournalWriteError | None) -> None:
        # The failure flag goes last: a parent that sees it finds the counters settled.
        counters.set(_DURABLE, stats.durable_seq)
        counters.set(_FSYNCS, stats.fsyncs)
        counters.set(_BYTES, stats.bytes_written)
        if failure is not None:
            counters.set(_FAILED, 1)

    try:
        writer = JournalWriter(
            Path(config.directory),
            first_seq=config.first_seq,
            commit_interval_s=config.commit_interval_s,
            commit_max_records=config.commit_max_records,
            lazy_interval_s=config.lazy_interval_s,
            on_commit=publish,
        )
    except OSError as exc:
        replies.send_bytes(_ENCODER.encode(_Failed(f"journal {config.directory}: {exc}")))
        return
    replies.send_bytes(_ENCODER.encode(_Done()))
    failure: JournalWriteError | None = None
    while True:
        try:
            raw = commands.recv_bytes()
        except (EOFError, OSError):
            # The parent is gone: exit now, writing nothing more (see the module's doc).
            os._exit(0)
        command = _COMMANDS.decode(raw)
        if isinstance(command, _Append):
            failure = failure or _append(writer, command)
            continue
        reply = _answer(writer, command, failure)
        replies.send_bytes(_ENCODER.encode(reply))
        if isinstance(command, _Close):
            return


def _append(writer: JournalWriter, command: _Append) -> JournalWriteError | None:
    """Queue the records (their seqs are the parent's); the writer's failure, if it failed."""
    try:
        seqs = writer.append_many(command.payloads, lazy=command.lazy)
    except JournalWriteError as error:
        return error  # the shared flag is already up: the parent asks for it
    if seqs.start != command.first_seq:
        raise AssertionError(
            f"journal {writer.directory}: the parent numbered records from "
            f"{command.first_seq}, the writer from {seqs.start}"
        )
    return None


def _answer(
    writer: JournalWriter, command: _Command, failure: JournalWriteError | None
) -> _Done | _Failed:
    try:
        if failure is not None:
            raise failure
        if isinstance(command, _Rotate):
            return _Done(value=writer.rotate())
        if isinstance(command, _DropThrough):
            return _Done(paths=[str(path) for path in writer.drop_through(command.seq)])
        if isinstance(command, _WaitDurable):
            return _Done(value=int(writer.wait_durable(command.seq, command.timeout_s)))
        if isinstance(command, _Close):
            writer.close()
            return _Done()
        if isinstance(command, _Describe):
            if writer.failure is not None:
                raise writer.failure
            return _Done()
        raise AssertionError(f"journal {writer.directory}: unknown command {command!r}")
    except OSError as error:
        return _Failed(str(error))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
