"""``bootstrap/dataset_identity.json``: the identity digest of every dataset row at the start.

Snapshots, the ledger and the replay index name prompts by dataset index
only. If the file behind a dataset changes under the same path, an index
names another prompt, and a resume would silently train on other data. So
the anchor records, once, when it is created, each row's identity digest
(SHA-256, what ``PromptDataset.identity`` returns) and every resume compares
the dataset against them (:mod:`rollvault.controller.snapshots.dataset_check`).

The digests are stored as one byte string (32 bytes a row, row 0 first;
base64 in the JSON), about 43 bytes a row, with a checksum of it: a flipped
byte of the file is reported as a damaged file, not as a changed row.
Standard library and msgspec only, like the rest of the durable layer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.durable.errors import IncompatibleRunError, SnapshotManifestError
from rollvault.durable.fsync import atomic_write_bytes
from rollvault.durable.layout import DATASET_IDENTITY_FILENAME

__all__ = [
    "DATASET_IDENTITY_SCHEMA_VERSION",
    "DatasetIdentity",
    "read_dataset_identity",
    "remove_dataset_identity",
    "write_dataset_identity",
]

DATASET_IDENTITY_SCHEMA_VERSION: Final = 1
ROW_DIGEST_BYTES: Final = 32

Hex64 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class DatasetIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The identity digests of a dataset's rows, in index order."""

    schema_version: int
    num_rows: Annotated[int, msgspec.Meta(ge=0)]
    row_digests: bytes
    """``num_rows`` SHA-256 digests of 32 bytes each, concatenated, row 0 first."""
    checksum: Hex64
    """SHA-256 (hex) of ``row_digests``: tells a damaged file from a changed dataset."""

    @classmethod
    def of_rows(cls, digests: Sequence[str]) -> DatasetIdentity:
        """The identity of a dataset whose row ``i`` has the hex SHA-256 ``digests[i]``."""
        try:
            joined = b"".join(bytes.fromhex(digest) for digest in digests)
        except ValueError as exc:
            raise ValueError(f"row digests must be SHA-256 hex digests: {exc}") from exc
        if len(joined) != ROW_DIGEST_BYTES * len(digests):
            raise ValueError(
                f"row digests must be SHA-256 hex digests ({2 * ROW_DIGEST_BYTES} hex digits)"
            )
        return cls(
            schema_version=DATASET_IDENTITY_SCHEMA_VERSION,
            num_rows=len(digests),
            row_digests=joined,
            checksum=hashlib.sha256(joined).hexdigest(),
        )

    def row_digest(self, idx: int) -> str:
        """The hex digest recorded for row ``idx``."""
        if not 0 <= idx < self.num_rows:
            raise IndexError(f"row {idx} out of range [0, {self.num_rows})")
        return self.row_digests[ROW_DIGEST_BYTES * idx : ROW_DIGEST_BYTES * (idx + 1)].hex()

    def changed_rows(self, other: DatasetIdentity) -> list[int]:
        """Indexes below both row counts whose digests differ between ``self`` and ``other``."""
        if self.row_digests == other.row_digests:
            return []
        size = ROW_DIGEST_BYTES
        mine, theirs = memoryview(self.row_digests), memoryview(other.row_digests)
        return [
            idx
            for idx in range(min(self.num_rows, other.num_rows))
            if mine[size * idx : size * (idx + 1)] != theirs[size * idx : size * (idx + 1)]
        ]


def write_dataset_identity(anchor: Path, identity: DatasetIdentity) -> Path:
    """Write ``<anchor>/dataset_identity.json`` atomically; returns its path."""
    path = anchor / DATASET_IDENTITY_FILENAME
    atomic_write_bytes(path, msgspec.json.encode(identity))
    return path


def remove_dataset_identity(anchor: Path) -> None:
    """Remove a left-over ``dataset_identity.json`` (an anchor made without a dataset has none)."""
    (anchor / DATASET_IDENTITY_FILENAME).unlink(missing_ok=True)


def read_dataset_identity(anchor: Path) -> DatasetIdentity | None:
    """The identity recorded under ``anchor``; None when there is none.

    None means the anchor predates this file (or was made without a
    dataset): such a run resumes without the check, as it did before.
    Raises ``SnapshotManifestError`` naming the file when it is unreadable,
    malformed or fails its checksum, and ``IncompatibleRunError`` when
    another schema version wrote it.
    """
    path = anchor / DATASET_IDENTITY_FILENAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotManifestError(f"{path}: unreadable: {exc}") from exc
    try:
        version = msgspec.json.decode(raw, type=_Versioned).schema_version
    except msgspec.DecodeError as exc:
        raise SnapshotManifestError(f"{path}: invalid dataset identity: {exc}") from exc
    if version != DATASET_IDENTITY_SCHEMA_VERSION:
        raise IncompatibleRunError(
            anchor,
            [
                f"dataset identity schema version: {version} -> "
                f"{DATASET_IDENTITY_SCHEMA_VERSION} (the anchor was written by another "
                "rollvault version)"
            ],
        )
    try:
        identity = msgspec.json.decode(raw, type=DatasetIdentity, strict=True)
    except msgspec.DecodeError as exc:
        raise SnapshotManifestError(f"{path}: invalid dataset identity: {exc}") from exc
    _check_intact(path, identity)
    return identity


class _Versioned(msgspec.Struct):
    """Just the version, read first: another version's fields need not decode as these."""

    schema_version: int


def _check_intact(path: Path, identity: DatasetIdentity) -> None:
    if len(identity.row_digests) != ROW_DIGEST_BYTES * identity.num_rows:
        raise SnapshotManifestError(
            f"{path}: corrupt: {len(identity.row_digests)} digest bytes for "
            f"{identity.num_rows} rows"
        )
    if hashlib.sha256(identity.row_digests).hexdigest() != identity.checksum:
        raise SnapshotManifestError(f"{path}: corrupt: its row digests fail their checksum")
