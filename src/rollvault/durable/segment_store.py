"""Segment files on disk: publishing one durably, and deleting those no kept snapshot references.

:func:`publish_segment` writes a new segment under its final name only when
it is complete and flushed (temporary, fsync, rename, fsync of the
directory), so a snapshot that names it is committed only after it is
durable, and a crash leaves a complete segment or none (plus a temporary).

:func:`delete_unreferenced` is the segments' retention.

Segments are shared: a segment may be deleted only once no committed snapshot
of its anchor references it. The caller computes what is referenced, after
the snapshot retention of :mod:`rollvault.durable.snapshot_dirs` has run, and
while it is the only writer (no snapshot being written could reference a
segment it has just written); this module deletes the rest, including the
temporaries of a segment write a crash interrupted. Orphans (segments written
for a snapshot that never committed, or whose last referencing snapshot was
just pruned) are therefore collected by the next snapshot's collection.

Each deletion is one ``unlink`` (atomic) and the directory is flushed after
them, so a crash at any point leaves every referenced segment whole and some
unreferenced ones still present, for the next collection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Set
from pathlib import Path
from typing import Final

from rollvault.durable.faults import fault_point
from rollvault.durable.fsync import _fsync_directory, atomic_write_bytes

SEQUENCE_DIGITS: Final = 6
"""Width of the zero-padded sequence number a writer names its segments after."""


def sequence_name(file: str, file_name: Callable[[str], str]) -> int | str:
    """How a compact index row names the segment ``file``: the sequence number when
    ``file`` is ``file_name`` of it, zero-padded (what a writer names its segments), else
    ``file`` itself (an older form's segment, another writer's). Half the bytes of the
    name in every snapshot of an anchor; :func:`file_of_sequence_name` inverts it."""
    stem, dash, _rest = file.partition("-")
    if (
        dash
        and stem.isascii()
        and stem.isdigit()
        and f"{int(stem):0{SEQUENCE_DIGITS}d}" == stem
        and file_name(stem) == file
    ):
        return int(stem)
    return file


def require_sequence_number(name: int | str, file_name: Callable[[str], str]) -> None:
    """Refuse a compact row's ``name`` given as text where :func:`sequence_name` writes a
    number: a ``ValueError`` naming the field (call it from the row's ``__post_init__``, so
    that msgspec's decode reports it at the row's path). Read as written, the two spellings
    name the same file; refused, a hand-made or foreign row cannot pass for the writer's."""
    if isinstance(name, str) and not isinstance(number := sequence_name(name, file_name), str):
        raise ValueError(f"[0] (name): the text {name!r} where its sequence number {number} is due")


def file_of_sequence_name(name: int | str, file_name: Callable[[str], str]) -> str:
    """The segment file a compact index row's ``name`` stands for (see :func:`sequence_name`)."""
    return name if isinstance(name, str) else file_name(f"{name:0{SEQUENCE_DIGITS}d}")


def publish_segment(path: Path, data: bytes) -> None:
    """Write the segment ``path`` durably (its directory is created if absent).

    Segments are named after the snapshot that writes them, whose sequence
    number is one more than any snapshot on disk. A file already under that
    name was therefore written by an earlier try at the same sequence number
    that failed or crashed before its commit (a failed snapshot's directory is
    removed, so its number is handed out again): no committed snapshot can
    reference it, and it is replaced (atomically).
    """
    _ensure_directory(path.parent)
    fault_point("segment.before_write")
    atomic_write_bytes(path, data)
    fault_point("segment.durable")


def publish_ledger_segment(path: Path, data: bytes) -> None:
    """Write the ledger segment ``path`` durably: as :func:`publish_segment`, own fault points."""
    _ensure_directory(path.parent)
    fault_point("ledger_segment.before_write")
    atomic_write_bytes(path, data)
    fault_point("ledger_segment.durable")


def publish_fact_segment(path: Path, data: bytes) -> None:
    """Write the group-facts segment ``path`` durably: as :func:`publish_segment`, own fault points."""
    _ensure_directory(path.parent)
    fault_point("fact_segment.before_write")
    atomic_write_bytes(path, data)
    fault_point("fact_segment.durable")


def publish_catalog(path: Path, data: bytes) -> None:
    """Write the segment catalog ``path`` durably: as :func:`publish_segment`, own fault points."""
    _ensure_directory(path.parent)
    fault_point("catalog.before_write")
    atomic_write_bytes(path, data)
    fault_point("catalog.durable")


class RecordedSegmentError(Exception):
    """A segment is missing, or not the one an index recorded (size, SHA-256)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def read_recorded_segment(
    path: Path, *, what: str, byte_size: int, sha256: str, recorded_in: str
) -> bytes:
    """The bytes of the segment ``path``, refused unless they are the ones ``recorded_in``
    recorded (``what`` names the segment's kind in the message: "ledger segment")."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise RecordedSegmentError(path, f"missing {what}") from exc
    except OSError as exc:
        raise RecordedSegmentError(path, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) != byte_size:
        raise RecordedSegmentError(
            path,
            f"size is {len(data)} bytes, {recorded_in} records {byte_size} "
            "(truncated or overwritten)",
        )
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise RecordedSegmentError(
            path, f"SHA-256 {actual} does not match {sha256} in {recorded_in}"
        )
    return data


def _ensure_directory(directory: Path) -> None:
    if not directory.is_dir():
        directory.mkdir()
        _fsync_directory(directory.parent)


def delete_unreferenced(
    directory: Path, referenced: Set[str], *, is_segment: Callable[[str], bool]
) -> list[str]:
    """Delete every segment of ``directory`` not in ``referenced``; return their names.

    ``is_segment(name)`` says which entries are segments (or a crashed write's
    temporary of one): nothing else is touched. A missing directory holds nothing.
    """
    if not directory.is_dir():
        return []
    doomed = sorted(
        entry.name
        for entry in directory.iterdir()
        if is_segment(entry.name) and entry.name not in referenced
    )
    for name in doomed:
        fault_point("segment_gc.before_delete")
        (directory / name).unlink(missing_ok=True)
        fault_point("segment_gc.after_delete")
    if doomed:
        _fsync_directory(directory)
        fault_point("segment_gc.synced")
    return doomed
