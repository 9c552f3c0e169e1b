"""The rollout snapshot manifest: what binds one rollout-state cut to a trainer anchor.

Persisted as ``manifest.json`` in every snapshot directory: JSON written by
msgspec, decoded strictly (unknown, missing or mistyped fields and unsupported
schema versions are rejected with the JSON path of the field). Never pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from rollvault.durable.errors import SnapshotManifestError
from rollvault.durable.layout import ROLLOUT_SNAPSHOT_MANIFEST_FILENAME

ROLLOUT_SNAPSHOT_SCHEMA_VERSION: Final = 3
SUPPORTED_ROLLOUT_SNAPSHOT_SCHEMA_VERSIONS: Final = frozenset({ROLLOUT_SNAPSHOT_SCHEMA_VERSION})

_Count = Annotated[int, msgspec.Meta(ge=0)]
_Fingerprint = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class RolloutSnapshotManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Identity binding one rollout-state cut to reconstructable trainer state.

    ``base_train_step`` and ``trainer_version`` name the durable trainer
    checkpoint the cut is anchored to (0 and 0 under the bootstrap anchor);
    ``bootstrap_fingerprint`` is the run's compatibility fingerprint, or None
    when the run does not record one. Every field is required, the optional
    ones as ``null``, so ``to_dict`` and ``from_mapping`` round-trip exactly.
    """

    schema_version: int
    base_train_step: _Count
    trainer_version: _Count
    current_epoch: _Count
    sampler_dispatch_index: _Count
    mutation_version: _Count
    rolled_back_train_group_count: _Count
    bootstrap_fingerprint: _Fingerprint | None
    next_nemo_gym_task_index: _Count | None

    def __post_init__(self) -> None:
        # Construction in code is checked like decoding, so an unsupported
        # version can never be written in the first place.
        _check_schema_version(self.schema_version)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RolloutSnapshotManifest:
        """Parse and validate a committed snapshot manifest.

        Raises ``SnapshotManifestError`` naming the offending field.
        """
        if not isinstance(raw, Mapping):
            raise SnapshotManifestError(
                f"rollout snapshot manifest must be a JSON object, got {type(raw).__name__}"
            )
        version = raw.get("schema_version")
        if isinstance(version, int) and not isinstance(version, bool):
            _check_schema_version(version)
        try:
            return msgspec.convert(dict(raw), type=cls, strict=True)
        except msgspec.ValidationError as exc:
            raise SnapshotManifestError(f"invalid rollout snapshot manifest: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest as plain JSON-ready data, every field included."""
        return msgspec.structs.asdict(self)


def _check_schema_version(version: int) -> None:
    if version not in SUPPORTED_ROLLOUT_SNAPSHOT_SCHEMA_VERSIONS:
        supported = sorted(SUPPORTED_ROLLOUT_SNAPSHOT_SCHEMA_VERSIONS)
        raise SnapshotManifestError(
            f"unsupported rollout snapshot schema version {version!r} - at "
            f"`$.schema_version` (supported: {supported})"
        )


class ResolvedRolloutCheckpoint(msgspec.Struct, frozen=True):
    """A committed rollout snapshot selected for startup recovery."""

    path: Path
    manifest: RolloutSnapshotManifest


def encode_snapshot_manifest(manifest: RolloutSnapshotManifest) -> bytes:
    """Serialize a manifest as the bytes stored in ``manifest.json``.

    Validates first: construction in code does not check field constraints
    (for example a negative count), decoding does, and nothing invalid may be
    written.
    """
    data = manifest.to_dict()
    RolloutSnapshotManifest.from_mapping(data)
    return msgspec.json.encode(data)


def write_snapshot_manifest(snapshot_dir: Path, manifest: RolloutSnapshotManifest) -> Path:
    """Write ``manifest.json`` into a temporary snapshot directory; return its path.

    Not flushed here: ``commit_snapshot`` flushes the whole tree before publishing.
    """
    path = snapshot_dir / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
    path.write_bytes(encode_snapshot_manifest(manifest))
    return path


def read_snapshot_manifest(snapshot_dir: Path) -> RolloutSnapshotManifest:
    """Read and validate ``manifest.json`` of a snapshot directory.

    Raises ``SnapshotManifestError`` naming the file and the problem.
    """
    path = snapshot_dir / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise SnapshotManifestError(f"{path}: missing") from exc
    except OSError as exc:
        raise SnapshotManifestError(f"{path}: unreadable: {exc}") from exc
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise SnapshotManifestError(f"{path}: not valid JSON: {exc}") from exc
    try:
        return RolloutSnapshotManifest.from_mapping(raw)
    except SnapshotManifestError as exc:
        raise SnapshotManifestError(f"{path}: {exc}") from exc
