"""The run lock: one process owns a checkpoint directory at a time.

A requeued job whose old copy is still alive, or an operator who starts the
same command twice, would otherwise run two writers on one directory: each
deletes the other's ``tmp_snapshot_*``, both publish trainer checkpoints, and
prompts get trained twice. ``acquire_run_lock`` takes an exclusive
``fcntl.flock`` on ``<checkpoint_dir>/.lock`` for the whole run and records the
holder (pid, host, start time, command) in it. The kernel drops the lock when
the holding process dies, however it dies, so a SIGKILLed run never leaves a
stale lock behind; the holder record left in the file is only read while the
lock is held by someone, to say who.

What the lock does not cover: ``flock`` is advisory and local to one kernel on
some network filesystems (old NFS clients emulate it per host or not at all),
so two hosts sharing such a filesystem may both acquire it. Readers
(``inspect``, ``verify``) take no lock.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from rollvault.durable.fsync import _fsync_directory

__all__ = [
    "RUN_LOCK_FILENAME",
    "RUN_LOCK_SCHEMA_VERSION",
    "RunLock",
    "RunLockHolder",
    "RunLockedError",
    "acquire_run_lock",
    "read_run_lock_holder",
]

RUN_LOCK_FILENAME: Final = ".lock"
RUN_LOCK_SCHEMA_VERSION: Final = 1


class RunLockHolder(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Who holds a checkpoint directory's run lock."""

    schema_version: int
    pid: int
    host: str
    started_at: str
    """UTC, ISO 8601."""
    command: list[str]

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started_at}: {' '.join(self.command)}"


class RunLockedError(Exception):
    """Another process holds the checkpoint directory's run lock."""

    def __init__(self, checkpoint_dir: Path, holder: RunLockHolder | None) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.holder = holder
        who = holder.describe() if holder is not None else "a process whose record is unreadable"
        super().__init__(
            f"{checkpoint_dir} is in use by another run ({who}); one process owns a "
            f"checkpoint directory at a time. Stop that run first, or use another "
            f"checkpointing.checkpoint_dir"
        )


class RunLock:
    """A held run lock; ``release`` (or leaving the ``with`` block) gives it up."""

    def __init__(self, path: Path, fd: int, holder: RunLockHolder) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the holder record and unlock; a second call does nothing."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            # Closing the descriptor releases the flock.
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def acquire_run_lock(checkpoint_dir: Path, *, command: Sequence[str] | None = None) -> RunLock:
    """Take ``checkpoint_dir``'s run lock, creating the directory if needed.

    Raises :class:`RunLockedError` at once (never waits) when another process
    holds it.
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / RUN_LOCK_FILENAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunLockedError(checkpoint_dir, read_run_lock_holder(checkpoint_dir)) from None
        raise
    holder = RunLockHolder(
        schema_version=RUN_LOCK_SCHEMA_VERSION,
        pid=os.getpid(),
        host=socket.gethostname(),
        started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=list(command if command is not None else sys.argv),
    )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, msgspec.json.encode(holder), 0)
        os.fsync(fd)
        _fsync_directory(checkpoint_dir)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(path, fd, holder)


def read_run_lock_holder(checkpoint_dir: Path) -> RunLockHolder | None:
    """The recorded holder, or None when there is none or it cannot be decoded.

    The record is advisory evidence for a message: a holder that is being
    written, or one left by a process that died, reads as whatever is there.
    """
    try:
        data = (checkpoint_dir / RUN_LOCK_FILENAME).read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        return None
    try:
        return msgspec.json.decode(data, type=RunLockHolder)
    except msgspec.DecodeError:
        return None
