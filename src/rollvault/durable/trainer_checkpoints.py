"""Trainer checkpoint directories ``step_<N>/``: publish, find the latest, prune.

A trainer checkpoint is written into ``tmp_step_<N>/``, flushed file by file,
renamed to ``step_<N>/`` and the parent flushed, the same atomic publication
as a rollout snapshot: a crash leaves either no ``step_<N>/`` or a complete
one. ``tmp_step_`` and ``trash_step_`` directories are never read and are
cleared by the next publication before it writes anything. Older checkpoints are pruned through
``trash_step_<N>`` so a half-deleted directory never keeps a committed name.

Before the rename, ``file_digests.json`` records the SHA-256 of every other
file of the checkpoint: weights and optimizer state carry no checksum of
their own, so without it a flipped byte would load silently.
:func:`verify_trainer_checkpoint` names every file that no longer matches.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.faults import fault_point
from rollvault.durable.file_digests import directory_digests, sha256_file
from rollvault.durable.fsync import _fsync_directory, _fsync_tree
from rollvault.durable.layout import ROLLOUT_SNAPSHOTS_DIRNAME
from rollvault.durable.retention import PruneFaultPoints, beyond_latest, prune_through_trash
from rollvault.durable.trash import remove_tree

_LOG = logging.getLogger("rollvault.durable")
_STEP_RE: Final = re.compile(r"step_([0-9]+)")
_LEFTOVER_RE: Final = re.compile(r"(tmp|trash)_step_([0-9]+)")
TRAINER_RETENTION_POINTS: Final = PruneFaultPoints(
    before_rename=lambda: fault_point("trainer_prune.before_trash_rename"),
    after_rename=lambda: fault_point("trainer_prune.after_trash_rename"),
    synced=lambda: fault_point("trainer_prune.trash_synced"),
    before_delete=lambda: fault_point("trainer_prune.before_trash_delete"),
    after_delete=lambda: fault_point("trainer_prune.after_trash_delete"),
)

TRAINER_DIGESTS_FILENAME: Final = "file_digests.json"
TRAINER_DIGESTS_SCHEMA_VERSION: Final = 1
SUPPORTED_TRAINER_DIGESTS_SCHEMA_VERSIONS: Final = frozenset({TRAINER_DIGESTS_SCHEMA_VERSION})


class TrainerCheckpointDigests(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``file_digests.json``: SHA-256 of every file of a trainer checkpoint but itself."""

    schema_version: int
    files: dict[str, str]
    """Relative posix path -> SHA-256 hex."""


def trainer_checkpoint_path(checkpoint_dir: Path, step: int) -> Path:
    """Where the trainer checkpoint of ``step`` lives."""
    return checkpoint_dir / f"step_{step}"


def trainer_checkpoint_steps(checkpoint_dir: Path) -> list[int]:
    """Steps of every committed trainer checkpoint, oldest first."""
    if not checkpoint_dir.is_dir():
        return []
    steps = []
    for entry in checkpoint_dir.iterdir():
        match = _STEP_RE.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_trainer_checkpoint(checkpoint_dir: Path) -> int | None:
    """The newest committed trainer checkpoint's step, or None."""
    steps = trainer_checkpoint_steps(checkpoint_dir)
    return steps[-1] if steps else None


def publish_trainer_checkpoint(
    checkpoint_dir: Path, step: int, write: Callable[[Path], None]
) -> Path:
    """Write ``step_<step>/`` atomically: ``write(tmp_dir)`` fills it, then commit.

    On ``OSError`` the temporary directory is removed and
    ``SnapshotWriteError`` is raised; committed checkpoints are untouched.
    """
    final = trainer_checkpoint_path(checkpoint_dir, step)
    if final.exists():
        raise SnapshotWriteError(f"trainer checkpoint {final} already exists")
    # Before anything is written: on a full disk, their space may be what it needs.
    _clear_leftovers(checkpoint_dir)
    tmp = checkpoint_dir / f"tmp_step_{step}"
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        write_file_digests(tmp)
        _fsync_tree(tmp)
        fault_point("trainer_checkpoint.tree_synced")
        os.rename(tmp, final)
    except OSError as exc:
        _remove_unpublished(tmp)
        raise SnapshotWriteError(
            f"writing trainer checkpoint {final} failed: {exc}; it was removed and earlier "
            "checkpoints are untouched"
        ) from exc
    except BaseException:
        _remove_unpublished(tmp)
        raise
    fault_point("trainer_checkpoint.after_rename")
    try:
        _fsync_directory(checkpoint_dir)
    except OSError as exc:
        raise SnapshotWriteError(
            f"published trainer checkpoint {final} but flushing {checkpoint_dir} failed: "
            f"{exc}; it is complete but may not survive a power loss"
        ) from exc
    fault_point("trainer_checkpoint.parent_synced")
    return final


def _remove_unpublished(tmp: Path) -> None:
    """Remove a ``tmp_step_`` directory after a failure, logging (not raising) a failure.

    The caller is reporting the error that made it give up; the next
    publication removes what is left.
    """
    try:
        remove_tree(tmp)
    except OSError as exc:
        _LOG.warning("could not remove unpublished trainer checkpoint %s: %s", tmp, exc)


def write_file_digests(directory: Path) -> None:
    """Write ``file_digests.json`` into ``directory``: the SHA-256 of every file in it.

    Call it last, once every other file is written; :func:`verify_trainer_checkpoint`
    checks a directory against it, whatever the directory holds.
    """
    digests = TrainerCheckpointDigests(
        schema_version=TRAINER_DIGESTS_SCHEMA_VERSION, files=directory_digests(directory)
    )
    (directory / TRAINER_DIGESTS_FILENAME).write_bytes(msgspec.json.encode(digests))


def verify_trainer_checkpoint(step_dir: Path) -> list[tuple[Path, str]]:
    """Every ``(file, problem)`` of ``step_dir`` against its digests (empty: none).

    Names the digest file when it is missing, unreadable or of an unsupported
    schema version, and each file that is missing, changed or not listed.
    """
    path = step_dir / TRAINER_DIGESTS_FILENAME
    try:
        recorded = msgspec.json.decode(path.read_bytes(), type=TrainerCheckpointDigests)
    except FileNotFoundError:
        return [(path, "missing, so the checkpoint's files cannot be checked")]
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return [(path, f"unreadable: {exc}")]
    if recorded.schema_version not in SUPPORTED_TRAINER_DIGESTS_SCHEMA_VERSIONS:
        supported = sorted(SUPPORTED_TRAINER_DIGESTS_SCHEMA_VERSIONS)
        return [(path, f"schema_version {recorded.schema_version} is not one of {supported}")]
    problems = []
    for name, digest in sorted(recorded.files.items()):
        file = step_dir / name
        if not file.is_file():
            problems.append((file, "missing"))
        elif sha256_file(file) != digest:
            problems.append((file, "content changed (digest mismatch)"))
    for file in sorted(_published_files(step_dir)):
        if file.relative_to(step_dir).as_posix() not in recorded.files:
            problems.append((file, f"not in {TRAINER_DIGESTS_FILENAME}"))
    return problems


def _published_files(step_dir: Path) -> list[Path]:
    """Files of the checkpoint as published: not the digests, not later rollout snapshots.

    ``rollout_snapshots/`` fills in after publication, and each snapshot
    there carries checksums of its own.
    """
    later = step_dir / ROLLOUT_SNAPSHOTS_DIRNAME
    return [
        path
        for path in step_dir.rglob("*")
        if path.is_file()
        and path.name != TRAINER_DIGESTS_FILENAME
        and not path.is_relative_to(later)
        and not any(part.startswith(".") for part in path.relative_to(step_dir).parts)
    ]


def prune_trainer_checkpoints(checkpoint_dir: Path, *, keep_latest: int) -> list[int]:
    """Delete all but the newest ``keep_latest`` trainer checkpoints; return their steps.

    The same retention as rollout snapshots (:mod:`rollvault.durable.retention`):
    each goes through ``trash_step_<N>`` before it is deleted.
    """
    if keep_latest < 1:
        raise ValueError(f"prune_trainer_checkpoints: keep_latest must be >= 1, got {keep_latest}")
    excess = beyond_latest(trainer_checkpoint_steps(checkpoint_dir), keep_latest_k=keep_latest)
    victims = [trainer_checkpoint_path(checkpoint_dir, step) for step in excess]
    prune_through_trash(checkpoint_dir, victims, points=TRAINER_RETENTION_POINTS)
    return excess


def _clear_leftovers(checkpoint_dir: Path) -> None:
    """Delete the ``tmp_step_`` and ``trash_step_`` directories of earlier failed writes.

    A failure only costs space (nothing reads them): it is logged, and the
    write goes on (a leftover of the same name then fails its mkdir).
    """
    if not checkpoint_dir.is_dir():
        return
    for entry in sorted(checkpoint_dir.iterdir()):
        if _LEFTOVER_RE.fullmatch(entry.name):
            try:
                remove_tree(entry)
            except OSError as exc:
                _LOG.warning("could not remove leftover trainer checkpoint %s: %s", entry, exc)
