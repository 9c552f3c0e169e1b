"""Choosing the committed rollout snapshot a restart resumes from."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from rollvault.durable.errors import NoUsableSnapshotError, SnapshotError
from rollvault.durable.manifest_schema import (
    ResolvedRolloutCheckpoint,
    RolloutSnapshotManifest,
    read_snapshot_manifest,
)
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root

_LOG = logging.getLogger("rollvault.durable")

SnapshotVerifier = Callable[[Path, RolloutSnapshotManifest], None]
"""Checks the rest of a snapshot's files: ``verify_snapshot(path, manifest)``.

It raises ``SnapshotError`` (or ``OSError``, for a missing or unreadable
file) naming the file and the problem to reject the snapshot, which makes
``resolve_latest_snapshot`` fall back to an older one. Any other exception is
a bug and propagates.
"""


def _mismatches(
    manifest: RolloutSnapshotManifest,
    *,
    expected_train_step: int,
    expected_trainer_version: int,
    expected_bootstrap_fingerprint: str | None,
) -> list[str]:
    checks = (
        ("base_train_step", manifest.base_train_step, expected_train_step),
        ("trainer_version", manifest.trainer_version, expected_trainer_version),
        ("bootstrap_fingerprint", manifest.bootstrap_fingerprint, expected_bootstrap_fingerprint),
    )
    return [
        f"{name} is {found!r}, expected {wanted!r}"
        for name, found, wanted in checks
        if found != wanted
    ]


def _rejection(
    path: Path,
    *,
    expected_train_step: int,
    expected_trainer_version: int,
    expected_bootstrap_fingerprint: str | None,
    verify_snapshot: SnapshotVerifier | None,
) -> tuple[RolloutSnapshotManifest | None, str | None]:
    """Return ``(manifest, None)`` for a usable snapshot, ``(None, reason)`` otherwise."""
    if not path.is_dir() or path.is_symlink():
        return None, "not a directory"
    try:
        manifest = read_snapshot_manifest(path)
    except SnapshotError as exc:
        return None, str(exc)
    mismatches = _mismatches(
        manifest,
        expected_train_step=expected_train_step,
        expected_trainer_version=expected_trainer_version,
        expected_bootstrap_fingerprint=expected_bootstrap_fingerprint,
    )
    if mismatches:
        return None, "incompatible manifest: " + "; ".join(mismatches)
    if verify_snapshot is not None:
        try:
            verify_snapshot(path, manifest)
        except (SnapshotError, OSError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
    return manifest, None


def resolve_latest_snapshot(
    anchor: Path,
    *,
    expected_train_step: int,
    expected_trainer_version: int,
    expected_bootstrap_fingerprint: str | None,
    verify_snapshot: SnapshotVerifier | None = None,
) -> ResolvedRolloutCheckpoint | None:
    """Select the newest complete snapshot compatible with its trainer anchor.

    Walks ``<anchor>/rollout_snapshots/snapshot_<seq>`` newest first and returns
    the first whose manifest parses, whose ``base_train_step``,
    ``trainer_version`` and ``bootstrap_fingerprint`` equal the expected ones,
    and which ``verify_snapshot`` (optional, see ``SnapshotVerifier``) accepts.
    Each rejected snapshot is logged as a WARNING on logger
    ``rollvault.durable`` with its path and problem. ``tmp_`` and ``trash_``
    directories are never read.

    Returns None when there is no committed snapshot; raises
    ``NoUsableSnapshotError`` listing every snapshot and why it was rejected
    when committed snapshots exist but none is usable.
    """
    candidates = list(reversed(committed_snapshot_paths(snapshots_root(anchor))))
    if not candidates:
        return None
    rejected: list[tuple[Path, str]] = []
    for path in candidates:
        manifest, reason = _rejection(
            path,
            expected_train_step=expected_train_step,
            expected_trainer_version=expected_trainer_version,
            expected_bootstrap_fingerprint=expected_bootstrap_fingerprint,
            verify_snapshot=verify_snapshot,
        )
        if manifest is not None:
            return ResolvedRolloutCheckpoint(path=path, manifest=manifest)
        assert reason is not None
        _LOG.warning("skipping rollout snapshot %s: %s", path, reason)
        rejected.append((path, reason))
    raise NoUsableSnapshotError(anchor, rejected)
