"""An append-only file of lines, each one on disk whole or not at all.

The run logs and the dispatch journal write through this. Each line goes to
the operating system in its own write calls (no user-space buffer), so it
survives the death of the process as soon as :meth:`AppendOnlyFile.append`
returns, and a failed write leaves nothing behind in a buffer that a later
flush could write out of order.

A write that fails for want of space (``ENOSPC``, ``EDQUOT``) is retried
with short, doubling waits for up to :data:`SPACE_RETRY_BUDGET_S`: the space
is often the run's own, held for a moment by a rollout snapshot that is
failing on the same disk and removes its partial files as it fails. The wait
blocks the caller (the lines are written inside mutation sections, which
cannot await), which is bounded and happens only while the disk is full.
When the write still fails, or fails otherwise, the partial line is cut off
and :class:`LogWriteError` is raised; the file then refuses every later line,
so that no line is ever written after a missing one.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Final

from rollvault.controller.loop.io_failures import LogWriteError

SPACE_RETRY_BUDGET_S: Final = 2.0
_FIRST_WAIT_S: Final = 0.001
_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


class AppendOnlyFile:
    """Appends whole lines to ``path`` (created if absent; ``exclusive``: must not exist)."""

    def __init__(self, path: Path, *, exclusive: bool = False) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        self.path = path
        self._fd: int | None = os.open(path, flags, 0o644)
        # The one writer appends: the size is known without a stat per line.
        self._size = os.fstat(self._fd).st_size
        self.failure: LogWriteError | None = None
        """Why the file refuses lines (None: it takes them)."""

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (a torn last line of a dead process)."""
        os.ftruncate(self._open_fd(), size)
        self._size = size

    def append(self, line: bytes) -> None:
        """Write ``line`` (ending in a newline) whole; raises :class:`LogWriteError`."""
        if self.failure is not None:
            raise self.failure
        fd = self._open_fd()
        wait = _FIRST_WAIT_S
        deadline = time.monotonic() + SPACE_RETRY_BUDGET_S
        while True:
            try:
                _write_all(fd, line)
                self._size += len(line)
                return
            except OSError as exc:
                self._cut_back(fd, self._size, exc)
                if exc.errno not in _SPACE_ERRNOS or time.monotonic() + wait > deadline:
                    self.failure = LogWriteError(
                        f"cannot write {self.path}: {exc.strerror or exc}"
                        + (
                            f" (still after {SPACE_RETRY_BUDGET_S:g} s of retries)"
                            if exc.errno in _SPACE_ERRNOS
                            else ""
                        )
                    )
                    raise self.failure from exc
            time.sleep(wait)
            wait *= 2

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: the file was closed")
        return self._fd

    def _cut_back(self, fd: int, size: int, cause: OSError) -> None:
        """Remove what a failed write left of its line (shrinking needs no space)."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            self.failure = LogWriteError(
                f"cannot write {self.path}: {cause.strerror or cause}, and cutting off the "
                f"partial line failed too: {exc.strerror or exc}"
            )
            raise self.failure from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
