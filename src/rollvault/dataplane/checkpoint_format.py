"""The on-disk format of a data-plane checkpoint, and its strict decoding.

This module describes version 1, the self-contained format ``save_checkpoint``
writes and rollout snapshots wrote before segments; rollout snapshots now
write version 3 (:mod:`rollvault.dataplane.segmented`: rows in shared segment
files, the directory holds only the index; version 2 is the same index in a
longer form), in the same envelope. All three load.

A version 1 checkpoint directory holds exactly:

- ``<partition>.safetensors`` for every partition, empty ones included (a
  safetensors file with no tensors), so every partition has one file and a
  missing file is always an error;
- ``metadata.json``, written last.

**Packed columns.** A partition file holds one tensor per *column*: the
arrays of one field and one dtype, concatenated over the partition's rows in
the order ``metadata.json`` lists them (sorted by key). The tensor is named
``"{field}/{dtype}"``; that name is unambiguous because dtype names contain no
``/``. One tensor per row field would be simpler to read by eye, but
safetensors pays a fixed cost per tensor on save and load (about 15 us each,
measured: ~1 s per 64k tensors) and its header grows with every row; packed,
a 16k-row partition is a handful of tensors. On load each row's slice is
copied out, so clearing rows later frees their memory.

**metadata.json** is a versioned envelope ``{"schema_version", "content_sha256",
"content"}``. ``content`` lists, per partition, its file name, SHA-256 and byte
size, and for every row its key, its array fields as ``[field, dtype, length]``
and its scalar fields as ``[field, value]``; plus ``user_metadata``, a JSON
object the checkpointer stores there (for each sidecar of the snapshot: its
SHA-256, schema version and group count). ``content_sha256`` is the SHA-256 of
the exact bytes of ``content`` in the file, so a flipped byte anywhere in
``metadata.json`` is detected, not just in the partition files. Lists rather
than JSON objects keep every decoding error's path exact (``$.content.
partitions[0].rows[3].arrays[1][2]``) and make duplicate names detectable.

Nothing here executes code from the files: JSON and safetensors only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from rollvault.dataplane.errors import DataPlaneCheckpointError, DataPlaneValidationError
from rollvault.dataplane.rows import INT64_MAX, INT64_MIN, RowDtype

SELF_CONTAINED_SCHEMA_VERSION = 1
"""Version 1 of ``metadata.json``: rows in the checkpoint's own partition files
(this module). ``save_checkpoint`` writes it; snapshots written before segments hold it."""
SEGMENTED_V2_SCHEMA_VERSION = 2
"""Version 2 of ``metadata.json``: rows in shared segment files
(:mod:`rollvault.dataplane.segmented`), each segment an object with its file
name, hex SHA-256 and base64 live bitmap. Still read; no longer written."""
SEGMENTED_V3_SCHEMA_VERSION = 3
"""Version 3 of ``metadata.json``: version 2's index in a compact form (each
segment an array, its name as a sequence number, its digest as raw bytes, its
held rows as runs or omitted when all are held). Still read; no longer written."""
SEGMENTED_V4_SCHEMA_VERSION = 4
"""Version 4 of ``metadata.json``: version 3's index with each segment's fixed
parts (partition, digest, sizes) in the anchor's catalog files
(:mod:`rollvault.dataplane.segment_catalog`), listed by digest; per segment only
its name, partition and held rows. Still read; no longer written."""
DATA_PLANE_SCHEMA_VERSION = 5
"""Version 5 of ``metadata.json``: version 4's index with the numbered segments whose
rows it all holds (most of a long anchor's) listed as runs of numbers per partition,
not one entry each. What rollout snapshots write."""
CATALOGUED_SCHEMA_VERSIONS = frozenset({SEGMENTED_V4_SCHEMA_VERSION, DATA_PLANE_SCHEMA_VERSION})
"""The versions whose segments' fixed parts are in catalogs."""
SEGMENTED_SCHEMA_VERSIONS = frozenset(
    {SEGMENTED_V2_SCHEMA_VERSION, SEGMENTED_V3_SCHEMA_VERSION, *CATALOGUED_SCHEMA_VERSIONS}
)
"""The versions that list segments rather than partition files."""
SUPPORTED_DATA_PLANE_SCHEMA_VERSIONS = frozenset(
    {SELF_CONTAINED_SCHEMA_VERSION, *SEGMENTED_SCHEMA_VERSIONS}
)
METADATA_FILENAME = "metadata.json"
PARTITION_FILE_SUFFIX = ".safetensors"

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_C = TypeVar("_C")

PartitionName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]


def partition_file_name(partition: str) -> str:
    """File name of a partition inside a checkpoint directory."""
    return f"{partition}{PARTITION_FILE_SUFFIX}"


def column_tensor_name(field: str, dtype: RowDtype) -> str:
    """Safetensors tensor name of the packed column of ``field`` with ``dtype``."""
    return f"{field}/{dtype.value}"


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 digest, as recorded in ``metadata.json``."""
    return hashlib.sha256(data).hexdigest()


class ArrayFieldEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One array field of a row: ``[field, dtype, length]``."""

    field: NonEmptyStr
    dtype: RowDtype
    length: NonNegativeInt


class ScalarFieldEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One scalar field of a row: ``[field, value]``."""

    field: NonEmptyStr
    value: Int64 | float | bool


class RowEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One row: its key, its array fields (in column order) and its scalars."""

    key: NonEmptyStr
    arrays: list[ArrayFieldEntry]
    scalars: list[ScalarFieldEntry]


class PartitionEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One partition file and the rows packed in it."""

    name: PartitionName
    file: NonEmptyStr
    sha256: Sha256Hex
    byte_size: NonNegativeInt
    rows: list[RowEntry]


class DataPlaneCheckpointContent(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What ``metadata.json`` describes: the partitions and the caller's metadata."""

    partitions: list[PartitionEntry]
    user_metadata: dict[str, Any]


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    content_sha256: Sha256Hex
    content: msgspec.Raw


class _VersionProbe(msgspec.Struct):
    schema_version: int


class DataPlaneCheckpointInfo(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What ``save_checkpoint`` wrote: total bytes of all files, rows per partition."""

    bytes_written: int
    row_counts: dict[str, int]

    @property
    def row_count(self) -> int:
        """Rows written over all partitions."""
        return sum(self.row_counts.values())


def encode_metadata(content: DataPlaneCheckpointContent) -> bytes:
    """Encode a version 1 ``metadata.json``: the versioned envelope around ``content``."""
    return encode_envelope(msgspec.json.encode(content), SELF_CONTAINED_SCHEMA_VERSION)


def encode_envelope(content_bytes: bytes, schema_version: int) -> bytes:
    """The envelope ``{"schema_version", "content_sha256", "content"}`` around encoded content."""
    envelope = _Envelope(
        schema_version=schema_version,
        content_sha256=sha256_hex(content_bytes),
        content=msgspec.Raw(content_bytes),
    )
    return msgspec.json.encode(envelope)


def metadata_schema_version(data: bytes, path: Path) -> int:
    """The ``schema_version`` of ``metadata.json``, refused unless this build reads it."""
    return _check_schema_version(data, path)


def decode_envelope(data: bytes, path: Path) -> tuple[int, bytes]:
    """The version and the checked content bytes of ``metadata.json``; problems name ``path``."""
    version = _check_schema_version(data, path)
    try:
        envelope = msgspec.json.decode(data, type=_Envelope, strict=True)
    except msgspec.DecodeError as exc:
        raise DataPlaneCheckpointError(path, f"invalid metadata: {exc}") from exc
    content_bytes = bytes(envelope.content)
    actual = sha256_hex(content_bytes)
    if actual != envelope.content_sha256:
        raise DataPlaneCheckpointError(
            path,
            f"checksum mismatch: $.content hashes to {actual}, "
            f"$.content_sha256 records {envelope.content_sha256}",
        )
    return version, content_bytes


def decode_content(content_bytes: bytes, kind: type[_C], path: Path) -> _C:
    """Decode checked content bytes as ``kind``; errors give the path from the file's root."""
    try:
        return msgspec.json.decode(content_bytes, type=kind, strict=True)
    except msgspec.DecodeError as exc:
        message = _content_path(str(exc))
        raise DataPlaneCheckpointError(path, f"invalid metadata: {message}") from exc


def decode_metadata(data: bytes, path: Path) -> DataPlaneCheckpointContent:
    """Decode and check a version 1 ``metadata.json``; every problem raises naming ``path``."""
    version, content_bytes = decode_envelope(data, path)
    if version != SELF_CONTAINED_SCHEMA_VERSION:
        raise DataPlaneCheckpointError(
            path,
            f"schema_version {version} lists segments, not partition files "
            "(read it with its segments directory)",
        )
    content = decode_content(content_bytes, DataPlaneCheckpointContent, path)
    check_content(content, path)
    return content


def replace_user_metadata(data: bytes, path: Path, user_metadata: dict[str, Any]) -> bytes:
    """``metadata.json`` of any version with its ``user_metadata`` replaced (checksum redone)."""
    version, content_bytes = decode_envelope(data, path)
    content = msgspec.json.decode(content_bytes, type=dict[str, Any])
    content["user_metadata"] = check_user_metadata(user_metadata)
    return encode_envelope(msgspec.json.encode(content), version)


def _content_path(message: str) -> str:
    # Paths in ``content`` errors are relative to it; report them from the file's root.
    if "`$" in message:
        return message.replace("`$", "`$.content")
    return f"{message} - at `$.content`"


def _check_schema_version(data: bytes, path: Path) -> int:
    # Probed first so that a future version is reported as such, not as
    # whatever field it renamed.
    try:
        probe = msgspec.json.decode(data, type=_VersionProbe, strict=True)
    except msgspec.DecodeError as exc:
        raise DataPlaneCheckpointError(path, f"invalid metadata: {exc}") from exc
    if probe.schema_version not in SUPPORTED_DATA_PLANE_SCHEMA_VERSIONS:
        supported = ", ".join(map(str, sorted(SUPPORTED_DATA_PLANE_SCHEMA_VERSIONS)))
        raise DataPlaneCheckpointError(
            path,
            f"unsupported schema_version {probe.schema_version} (this build reads {supported})",
        )
    return probe.schema_version


def check_content(content: DataPlaneCheckpointContent, path: Path) -> None:
    """Check what the schema cannot: unique names and consistent file names."""
    seen_partitions: dict[str, int] = {}
    for index, partition in enumerate(content.partitions):
        where = f"$.content.partitions[{index}]"
        first = seen_partitions.setdefault(partition.name, index)
        if first != index:
            raise DataPlaneCheckpointError(
                path,
                f"{where}.name: duplicate partition {partition.name!r} "
                f"(first at partitions[{first}])",
            )
        expected_file = partition_file_name(partition.name)
        if partition.file != expected_file:
            raise DataPlaneCheckpointError(
                path, f"{where}.file: {partition.file!r}, expected {expected_file!r}"
            )
        _check_rows(partition.rows, where, path)


def _check_rows(rows: list[RowEntry], where: str, path: Path) -> None:
    seen_keys: dict[str, int] = {}
    for row_index, row in enumerate(rows):
        first = seen_keys.setdefault(row.key, row_index)
        if first != row_index:
            raise DataPlaneCheckpointError(
                path,
                f"{where}.rows[{row_index}].key: duplicate key {row.key!r} "
                f"(first at rows[{first}])",
            )
        fields = [entry.field for entry in row.arrays] + [entry.field for entry in row.scalars]
        if len(set(fields)) != len(fields):
            duplicates = sorted({field for field in fields if fields.count(field) > 1})
            raise DataPlaneCheckpointError(
                path, f"{where}.rows[{row_index}]: duplicate fields {duplicates} in row {row.key!r}"
            )


def check_user_metadata(user_metadata: object) -> dict[str, Any]:
    """Return a JSON-decoded copy of ``user_metadata``, refusing anything JSON would alter.

    Tuples, NaN or infinite floats, non-``str`` keys and non-JSON types (numpy
    scalars, paths, ...) would come back different or not at all, so they are
    errors naming the first offending path.
    """
    if not isinstance(user_metadata, Mapping):
        raise DataPlaneValidationError(
            f"user_metadata must be a mapping (a JSON object), got {type(user_metadata).__name__}"
        )
    user_metadata = dict(user_metadata)
    try:
        decoded = msgspec.json.decode(msgspec.json.encode(user_metadata), type=dict[str, Any])
    except (msgspec.MsgspecError, TypeError, ValueError) as exc:
        raise DataPlaneValidationError(f"user_metadata is not JSON-encodable: {exc}") from exc
    problem = _json_difference(user_metadata, decoded, "$")
    if problem is not None:
        raise DataPlaneValidationError(f"user_metadata does not round-trip through JSON: {problem}")
    return decoded


def _json_difference(original: object, decoded: object, path: str) -> str | None:
    if isinstance(original, dict) and isinstance(decoded, dict):
        for key, value in original.items():
            if not isinstance(key, str):
                return f"{path}: key {key!r} is not a str"
            problem = _json_difference(value, decoded.get(key), f"{path}.{key}")
            if problem is not None:
                return problem
        return None
    if isinstance(original, list) and isinstance(decoded, list):
        for index, (value, back) in enumerate(zip(original, decoded, strict=True)):
            problem = _json_difference(value, back, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if type(original) is not type(decoded) or original != decoded:
        return f"{path}: {original!r} ({type(original).__name__}) comes back as {decoded!r}"
    return None
