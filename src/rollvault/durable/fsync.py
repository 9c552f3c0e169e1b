"""Flushing files, directories and whole trees, and small atomic file writes.

A rename is only as durable as the directory that holds it, and a file's
bytes only as durable as its own fsync: publication therefore flushes every
file, then every directory bottom-up, then renames, then flushes the parent.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from rollvault.durable.errors import SnapshotLayoutError
from rollvault.durable.faults import fault_point


def _fsync_file(path: Path) -> None:
    """Flush one completed regular file to its backing filesystem."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(path: Path) -> None:
    """Flush directory-entry updates such as rename and replace."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_walk_error(exc: OSError) -> None:
    # os.walk ignores unreadable directories unless told otherwise, and a
    # directory we cannot list is one we cannot flush.
    raise exc


def _require_regular(path: Path, *, directory: bool) -> None:
    mode = os.lstat(path).st_mode
    wanted = stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)
    if not wanted:
        kind = "directory" if directory else "regular file"
        raise SnapshotLayoutError(
            f"{path}: a snapshot may hold only regular files and directories, "
            f"expected a {kind} here (symlinks and special files are refused)"
        )


def _fsync_tree(root: Path) -> None:
    """Flush every snapshot payload before publishing its directory.

    Files first, then each directory after its children, ``root`` last.
    Refuses symlinks and special files: a snapshot must not point outside itself.
    """
    _require_regular(root, directory=True)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False, onerror=_raise_walk_error):
        directory = Path(dirpath)
        for name in sorted(dirnames):
            _require_regular(directory / name, directory=True)
        for name in sorted(filenames):
            file_path = directory / name
            _require_regular(file_path, directory=False)
            _fsync_file(file_path)
            fault_point("fsync_tree.file_synced")
        _fsync_directory(directory)
        fault_point("fsync_tree.directory_synced")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp."


def _remove_stale_tmp_files(path: Path) -> None:
    """Remove temporaries that earlier crashed writes of ``path`` left behind."""
    prefix = _tmp_prefix(path)
    for sibling in path.parent.iterdir():
        if sibling.name.startswith(prefix):
            sibling.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new bytes.

    Writes a hidden temporary in the same directory, fsyncs it, renames it over
    ``path`` and fsyncs the directory. For small files such as manifests.
    On error the temporary is removed and the ``OSError`` propagates.
    """
    _remove_stale_tmp_files(path)
    tmp = path.with_name(f"{_tmp_prefix(path)}{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            fault_point("atomic_write.file_written")
            os.fsync(fd)
        finally:
            os.close(fd)
        fault_point("atomic_write.file_synced")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fault_point("atomic_write.renamed")
    _fsync_directory(path.parent)
    fault_point("atomic_write.parent_synced")
