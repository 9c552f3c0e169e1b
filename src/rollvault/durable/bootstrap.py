"""The bootstrap anchor: the trainer-version-zero home of early rollout snapshots.

``<checkpoint_dir>/bootstrap/manifest.json`` stores the run's compatibility
identity and its fingerprint; ``bootstrap/dataset_identity.json`` beside it
the identity digest of every dataset row (:mod:`rollvault.durable.dataset_identity`). It is written once, atomically, and validated on
every later start: a run whose identity differs is refused with every changed
dotpath. Snapshots under ``bootstrap/rollout_snapshots`` are pruned once a
durable trainer checkpoint exists.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from rollvault.durable.compatibility import (
    BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION,
    BootstrapCompatibilityIdentity,
    _compatibility_differences,
    _format_changed_value,
    config_as_now_read,
)
from rollvault.durable.config_paths import canonical_json
from rollvault.durable.dataset_identity import (
    DatasetIdentity,
    remove_dataset_identity,
    write_dataset_identity,
)
from rollvault.durable.errors import IncompatibleRunError, SnapshotManifestError
from rollvault.durable.faults import fault_point
from rollvault.durable.fsync import _fsync_directory, atomic_write_bytes
from rollvault.durable.layout import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    ROLLOUT_SNAPSHOTS_DIRNAME,
)
from rollvault.durable.retention import PruneFaultPoints, prune_through_trash, trash_name
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_steps

BOOTSTRAP_PRUNE_POINTS: Final = PruneFaultPoints(
    before_rename=lambda: fault_point("bootstrap_prune.before_rename"),
    after_rename=lambda: fault_point("bootstrap_prune.after_rename"),
    synced=lambda: fault_point("bootstrap_prune.anchor_synced"),
    before_delete=lambda: fault_point("bootstrap_prune.before_delete"),
    after_delete=lambda: fault_point("bootstrap_prune.after_delete"),
)


class BootstrapAnchorManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``bootstrap/manifest.json``: the run's compatibility identity and its fingerprint."""

    schema_version: int
    excluded_paths: list[str]
    config: dict[str, Any]
    fingerprint: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]

    def stored_identity(self) -> BootstrapCompatibilityIdentity:
        """The compatibility identity stored beside the fingerprint."""
        return BootstrapCompatibilityIdentity(
            schema_version=self.schema_version,
            excluded_paths=tuple(self.excluded_paths),
            config=self.config,
        )

    def fingerprint_matches_identity(self) -> bool:
        """Whether ``fingerprint`` is the digest of the stored identity (False: corrupt)."""
        return self.stored_identity().fingerprint() == self.fingerprint


def _bootstrap_anchor_manifest(identity: BootstrapCompatibilityIdentity) -> dict[str, Any]:
    """Build the bootstrap manifest from one self-consistent identity.

    The fingerprint is computed from the very dict that is stored beside it.
    """
    stored = identity.to_dict()
    return {**stored, "fingerprint": hashlib.sha256(canonical_json(stored)).hexdigest()}


def _ensure_directory(path: Path) -> None:
    if path.is_dir():
        return
    _ensure_directory(path.parent)
    path.mkdir(exist_ok=True)
    _fsync_directory(path.parent)


def holds_run(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` holds a run: a bootstrap anchor or a trainer checkpoint.

    The anchor counts once its ``manifest.json`` exists: it is written
    atomically on the run's first start, so a ``bootstrap/`` without it (a
    start killed while creating it) holds nothing yet. A trainer checkpoint
    ``step_<N>/`` is a run even when the anchor was lost.
    """
    manifest = checkpoint_dir / BOOTSTRAP_DIRNAME / BOOTSTRAP_MANIFEST_FILENAME
    return manifest.exists() or bool(trainer_checkpoint_steps(checkpoint_dir))


def ensure_bootstrap_anchor(
    checkpoint_dir: Path,
    *,
    identity: BootstrapCompatibilityIdentity,
    dataset_identity: DatasetIdentity | None = None,
) -> Path:
    """Create or validate the lightweight trainer-version-zero anchor.

    Creates ``<checkpoint_dir>/bootstrap/manifest.json`` atomically when it does
    not exist, otherwise validates it against ``identity`` (raising
    ``IncompatibleRunError`` listing every changed dotpath). Returns the anchor
    directory ``<checkpoint_dir>/bootstrap``.

    A new anchor records ``dataset_identity`` (the dataset's row digests) in
    ``dataset_identity.json``, written before the manifest: an anchor never
    exists without the identity of the dataset it was made for. An existing
    anchor's record is left alone (comparing a dataset against it is the
    caller's, which can say where a row comes from).
    """
    return open_bootstrap_anchor(
        checkpoint_dir, identity=identity, dataset_identity=dataset_identity
    ).path


@dataclass(frozen=True)
class BootstrapAnchor:
    """An anchor that :func:`open_bootstrap_anchor` created or validated."""

    path: Path
    fingerprint: str
    """The fingerprint the run continues under: the manifest's (an older rollvault's
    anchor may carry another than this config's, see :func:`validate_bootstrap_anchor`)."""


def open_bootstrap_anchor(
    checkpoint_dir: Path,
    *,
    identity: BootstrapCompatibilityIdentity,
    dataset_identity: DatasetIdentity | None = None,
) -> BootstrapAnchor:
    """:func:`ensure_bootstrap_anchor`, also returning the run's fingerprint.

    The manifest is read once, and the fingerprint is the one it holds (for a
    new anchor, the one just written), so a caller need not read it again.
    """
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    manifest_path = anchor / BOOTSTRAP_MANIFEST_FILENAME
    if manifest_path.exists():
        return BootstrapAnchor(anchor, validate_bootstrap_anchor(anchor, identity=identity))
    _ensure_directory(anchor)
    if dataset_identity is not None:
        write_dataset_identity(anchor, dataset_identity)
    else:
        remove_dataset_identity(anchor)  # one a start killed before its manifest left
    manifest = _bootstrap_anchor_manifest(identity)
    atomic_write_bytes(manifest_path, canonical_json(manifest))
    return BootstrapAnchor(anchor, manifest["fingerprint"])


def read_bootstrap_manifest(anchor: Path) -> BootstrapAnchorManifest:
    """Read ``<anchor>/manifest.json`` strictly, without judging it against a run.

    Raises ``SnapshotManifestError`` naming the file when it is missing,
    unreadable, not JSON or malformed (an unknown, missing or mistyped field),
    and ``IncompatibleRunError`` when another compatibility schema version
    wrote it. Whether its fingerprint still matches the identity stored beside
    it is :meth:`BootstrapAnchorManifest.fingerprint_matches_identity`.
    """
    path = anchor / BOOTSTRAP_MANIFEST_FILENAME
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except FileNotFoundError as exc:
        raise SnapshotManifestError(f"{path}: missing; not a bootstrap anchor") from exc
    except OSError as exc:
        raise SnapshotManifestError(f"{path}: unreadable: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise SnapshotManifestError(f"{path}: not valid JSON: {exc}") from exc
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version != BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION:
        raise IncompatibleRunError(
            anchor,
            [
                f"bootstrap compatibility schema version: {version} -> "
                f"{BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION} (the anchor was written by "
                "another rollvault version)"
            ],
        )
    try:
        return msgspec.convert(raw, type=BootstrapAnchorManifest, strict=True)
    except msgspec.ValidationError as exc:
        raise SnapshotManifestError(f"{path}: invalid bootstrap anchor manifest: {exc}") from exc


def _read_anchor_manifest(anchor: Path) -> BootstrapAnchorManifest:
    manifest = read_bootstrap_manifest(anchor)
    if not manifest.fingerprint_matches_identity():
        raise SnapshotManifestError(
            f"{anchor / BOOTSTRAP_MANIFEST_FILENAME}: corrupt: its fingerprint does not match "
            "the identity stored beside it"
        )
    return manifest


def _identity_differences(
    stored: BootstrapCompatibilityIdentity, identity: BootstrapCompatibilityIdentity
) -> list[str]:
    """What differs between an anchor's identity and this run's, as this version reads it.

    Empty when the anchor was written by an older rollvault whose only
    differences are paths since declared operational and settings since added
    at their legacy values (:func:`config_as_now_read`): that run resumes
    under its own fingerprint.
    """
    lines = []
    no_longer = sorted(set(stored.excluded_paths) - set(identity.excluded_paths))
    if no_longer:
        old = _format_changed_value(list(stored.excluded_paths))
        new = _format_changed_value(list(identity.excluded_paths))
        lines.append(f"excluded operational paths: {old} -> {new}")
    lines += _compatibility_differences(
        config_as_now_read(stored, identity), identity.to_dict()["config"]
    )
    return lines


def validate_bootstrap_anchor(anchor: Path, *, identity: BootstrapCompatibilityIdentity) -> str:
    """Validate a bootstrap anchor without modifying checkpoint state; return its fingerprint.

    Raises ``SnapshotManifestError`` when the anchor's manifest is missing or
    corrupt, and ``IncompatibleRunError`` listing every changed dotpath (values
    of secret-looking keys redacted) when ``identity`` differs from it. An
    anchor an older rollvault wrote before some settings existed passes when
    this run holds those settings at the values that do what that run did
    (:func:`~rollvault.durable.compatibility.config_as_now_read`); the run
    then continues under the anchor's fingerprint (the manifest's), which
    its snapshots carry, which is what this returns.
    """
    manifest = _read_anchor_manifest(anchor)
    if manifest.fingerprint == identity.fingerprint():
        return manifest.fingerprint
    differences = _identity_differences(manifest.stored_identity(), identity)
    if identity.schema_version != manifest.schema_version:
        differences.insert(
            0,
            f"bootstrap compatibility schema version: {manifest.schema_version} -> "
            f"{identity.schema_version}",
        )
    if differences:
        raise IncompatibleRunError(anchor, differences)
    return manifest.fingerprint


def prune_bootstrap_snapshots(checkpoint_dir: Path, *, durable_trainer_checkpoint: Path) -> bool:
    """Remove trainer-version-zero snapshots once a trainer checkpoint exists.

    Does nothing and returns False unless ``durable_trainer_checkpoint`` is an
    existing directory outside the bootstrap anchor. Otherwise renames
    ``bootstrap/rollout_snapshots`` to ``bootstrap/trash_rollout_snapshots``,
    flushes the anchor, deletes the trash (finishing one a crashed earlier
    prune left) and returns whether anything was removed, by the retention
    mechanism of :mod:`rollvault.durable.retention`. The anchor's manifest is
    kept.
    """
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    if _is_within(durable_trainer_checkpoint, anchor):
        raise ValueError(
            f"durable_trainer_checkpoint {durable_trainer_checkpoint} is inside the bootstrap "
            f"anchor {anchor}; it must be a trainer checkpoint such as step_<N>"
        )
    if not durable_trainer_checkpoint.is_dir():
        return False
    snapshots = anchor / ROLLOUT_SNAPSHOTS_DIRNAME
    trash = trash_name(snapshots)  # BOOTSTRAP_TRASH_DIRNAME
    deleted = prune_through_trash(
        anchor,
        [snapshots] if os.path.lexists(snapshots) else [],
        points=BOOTSTRAP_PRUNE_POINTS,
        unfinished=[trash] if os.path.lexists(trash) else [],
    )
    return bool(deleted)


def _is_within(path: Path, parent: Path) -> bool:
    resolved, resolved_parent = path.resolve(), parent.resolve()
    return resolved == resolved_parent or resolved_parent in resolved.parents
