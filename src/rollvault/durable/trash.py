"""Deleting directory trees that are never read again (``tmp_`` and ``trash_``).

Deletion is the last step of retention and of leftover cleanup, so a crash in
the middle of it leaves a partial tree under a name restore never reads; the
next cleanup finishes the job.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollvault.durable.faults import fault_point


def _raise_walk_error(exc: OSError) -> None:
    raise exc


def remove_tree(root: Path) -> None:
    """Delete ``root`` and everything under it, without following symlinks.

    A missing ``root`` is not an error: an earlier, interrupted cleanup may
    already have removed it.
    """
    if not os.path.lexists(root):
        return
    if root.is_symlink() or not root.is_dir():
        root.unlink()
        return
    for dirpath, dirnames, filenames in os.walk(root, topdown=False, onerror=_raise_walk_error):
        directory = Path(dirpath)
        for name in filenames:
            (directory / name).unlink()
            fault_point("trash.file_deleted")
        for name in dirnames:
            child = directory / name
            if child.is_symlink():
                child.unlink()
            else:
                child.rmdir()
    root.rmdir()
