"""Writing and reading data-plane checkpoints (blocking; run in a worker thread).

The format is described in :mod:`rollvault.dataplane.checkpoint_format`.
Writing does not fsync or publish: the checkpointer writes into a temporary
snapshot directory, then fsyncs the whole tree and commits it atomically.
Reading verifies everything (file set, sizes, checksums, schema, tensor
layout) before returning a single row, so a damaged checkpoint is refused
whole, never half-loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import (
    METADATA_FILENAME,
    ArrayFieldEntry,
    DataPlaneCheckpointContent,
    DataPlaneCheckpointInfo,
    PartitionEntry,
    RowEntry,
    ScalarFieldEntry,
    column_tensor_name,
    decode_metadata,
    encode_metadata,
    partition_file_name,
    sha256_hex,
)
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.rows import RowArray, RowDtype, RowValue, RowView, row_dtype
from rollvault.durable.io_errors import os_error_in

_HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A fully verified checkpoint: rows per partition, and the saved ``user_metadata``."""

    partitions: dict[str, dict[str, RowView]]
    user_metadata: dict[str, Any]


def write_checkpoint(
    directory: Path, capture: DataPlaneCapture, user_metadata: dict[str, Any]
) -> DataPlaneCheckpointInfo:
    """Write ``capture`` into ``directory`` (created if absent, must be empty).

    ``user_metadata`` must already be checked JSON (see ``check_user_metadata``).
    Partition files are written first and ``metadata.json`` last.
    """
    directory.mkdir(exist_ok=True)
    leftovers = sorted(entry.name for entry in directory.iterdir())
    if leftovers:
        raise DataPlaneCheckpointError(
            directory, f"checkpoint directory is not empty (holds {leftovers})"
        )
    entries = [
        _write_partition(directory, name, capture.rows(name)) for name in capture.partitions()
    ]
    metadata = encode_metadata(
        DataPlaneCheckpointContent(partitions=entries, user_metadata=user_metadata)
    )
    with open(directory / METADATA_FILENAME, "xb") as handle:
        handle.write(metadata)
    return DataPlaneCheckpointInfo(
        bytes_written=len(metadata) + sum(entry.byte_size for entry in entries),
        row_counts=capture.row_counts(),
    )


def _write_partition(directory: Path, name: str, rows: Mapping[str, RowView]) -> PartitionEntry:
    columns: dict[tuple[str, RowDtype], list[RowArray]] = {}
    entries: list[RowEntry] = []
    for key in sorted(rows):
        arrays: list[ArrayFieldEntry] = []
        scalars: list[ScalarFieldEntry] = []
        for field, value in rows[key].items():
            if isinstance(value, np.ndarray):
                dtype = row_dtype(value)
                columns.setdefault((field, dtype), []).append(value)
                arrays.append(ArrayFieldEntry(field, dtype, value.shape[0]))
            else:
                scalars.append(ScalarFieldEntry(field, value))
        entries.append(RowEntry(key=key, arrays=arrays, scalars=scalars))
    tensors = {
        column_tensor_name(field, dtype): np.concatenate(parts)
        for (field, dtype), parts in columns.items()
    }
    path = directory / partition_file_name(name)
    try:
        safetensors.numpy.save_file(tensors, path)
    except safetensors.SafetensorError as exc:
        # A full disk must reach the snapshot writer as the OSError it is.
        os_error = os_error_in(exc, path)
        if os_error is None:
            raise
        raise os_error from exc
    digest, size = _hash_file(path)
    return PartitionEntry(name=name, file=path.name, sha256=digest, byte_size=size, rows=entries)


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_checkpoint(directory: Path, *, metadata: bytes | None = None) -> LoadedCheckpoint:
    """Read and verify a checkpoint written by :func:`write_checkpoint`.

    ``metadata`` is the bytes of its ``metadata.json`` when the caller already
    read them (to tell the version), else they are read here. Raises
    :class:`DataPlaneCheckpointError` naming the file and the problem:
    a missing or extra file, a size or checksum mismatch, a schema violation,
    an unsupported ``schema_version``, or tensors that disagree with
    ``metadata.json``.
    """
    if not directory.is_dir():
        raise DataPlaneCheckpointError(directory, "not a checkpoint directory (absent or a file)")
    if metadata is None:
        content = read_checkpoint_metadata(directory)
    else:
        content = decode_metadata(metadata, directory / METADATA_FILENAME)
    _check_file_set(directory, content)
    partitions = {
        entry.name: _read_partition(directory / entry.file, entry, index)
        for index, entry in enumerate(content.partitions)
    }
    return LoadedCheckpoint(partitions=partitions, user_metadata=content.user_metadata)


def read_checkpoint_metadata(directory: Path) -> DataPlaneCheckpointContent:
    """Read and verify only ``metadata.json``: row listing and ``user_metadata``, no tensors.

    For a cheap look (``inspect``, choosing a snapshot); :func:`read_checkpoint`
    is the full verification.
    """
    return decode_metadata(
        read_checkpoint_file(directory / METADATA_FILENAME), directory / METADATA_FILENAME
    )


def _check_file_set(directory: Path, content: DataPlaneCheckpointContent) -> None:
    expected = {METADATA_FILENAME} | {entry.file for entry in content.partitions}
    present = {entry.name for entry in directory.iterdir()}
    missing = sorted(expected - present)
    if missing:
        raise DataPlaneCheckpointError(
            directory / missing[0], f"missing file (listed in {METADATA_FILENAME})"
        )
    unexpected = sorted(present - expected)
    if unexpected:
        raise DataPlaneCheckpointError(
            directory / unexpected[0], f"unexpected file (not listed in {METADATA_FILENAME})"
        )


def read_checkpoint_file(path: Path) -> bytes:
    """The bytes of one of a checkpoint's files; a missing or unreadable one raises
    :class:`DataPlaneCheckpointError` naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataPlaneCheckpointError(path, "missing file") from None
    except OSError as exc:
        raise DataPlaneCheckpointError(path, f"unreadable: {exc}") from exc


def _read_partition(path: Path, entry: PartitionEntry, index: int) -> dict[str, RowView]:
    data = read_checkpoint_file(path)
    if len(data) != entry.byte_size:
        raise DataPlaneCheckpointError(
            path,
            f"size is {len(data)} bytes, {METADATA_FILENAME} records {entry.byte_size} "
            "(truncated or overwritten)",
        )
    digest = sha256_hex(data)
    if digest != entry.sha256:
        raise DataPlaneCheckpointError(
            path,
            f"checksum mismatch: SHA-256 is {digest}, {METADATA_FILENAME} records {entry.sha256}",
        )
    try:
        tensors = safetensors.numpy.load(data)
    except (safetensors.SafetensorError, KeyError, ValueError) as exc:
        raise DataPlaneCheckpointError(path, f"not a readable safetensors file: {exc}") from exc
    del data
    _check_columns(path, entry, tensors, index)
    return _slice_rows(entry, tensors)


def _column_lengths(entry: PartitionEntry) -> dict[str, tuple[RowDtype, int]]:
    lengths: dict[tuple[str, RowDtype], int] = {}
    for row in entry.rows:
        for array in row.arrays:
            column = (array.field, array.dtype)
            lengths[column] = lengths.get(column, 0) + array.length
    return {
        column_tensor_name(field, dtype): (dtype, length)
        for (field, dtype), length in lengths.items()
    }


def _check_columns(
    path: Path, entry: PartitionEntry, tensors: Mapping[str, RowArray], index: int
) -> None:
    expected = _column_lengths(entry)
    where = f"$.content.partitions[{index}] in {METADATA_FILENAME}"
    if set(tensors) != set(expected):
        raise DataPlaneCheckpointError(
            path,
            f"holds tensors {sorted(tensors)}, {where} describes columns {sorted(expected)}",
        )
    for tensor, (dtype, length) in expected.items():
        array = tensors[tensor]
        if array.dtype.name != dtype.value or array.shape != (length,):
            raise DataPlaneCheckpointError(
                path,
                f"tensor {tensor!r} is {array.dtype.name}{list(array.shape)}, "
                f"{where} describes {dtype.value}[{length}]",
            )


def _slice_rows(entry: PartitionEntry, tensors: Mapping[str, RowArray]) -> dict[str, RowView]:
    columns = {
        (array.field, array.dtype): tensors[column_tensor_name(array.field, array.dtype)]
        for row in entry.rows
        for array in row.arrays
    }
    offsets = dict.fromkeys(columns, 0)
    rows: dict[str, RowView] = {}
    for row in entry.rows:
        values: dict[str, RowValue] = {}
        for array in row.arrays:
            column = (array.field, array.dtype)
            start = offsets[column]
            # A copy per row, so that clearing rows later frees their memory.
            values[array.field] = _read_only(columns[column][start : start + array.length].copy())
            offsets[column] = start + array.length
        for scalar in row.scalars:
            values[scalar.field] = scalar.value
        rows[row.key] = MappingProxyType(values)
    return rows


def _read_only(array: RowArray) -> RowArray:
    array.flags.writeable = False
    return array
