"""Segment files: immutable token rows, written once and referenced by every snapshot that needs them.

A segment holds rows of one partition, written by one snapshot: the rows new
since the snapshot before it. Its bytes never change after it is written;
the snapshots that reference it record its SHA-256 and size, and which of its
rows they still hold (see :mod:`rollvault.dataplane.segmented`).

**Format.** One safetensors file. Rows are grouped by *schema* (their ordered
fields, each an array of one dtype or an ``int``, ``float`` or ``bool``
scalar), groups in order of first appearance, rows sorted by key inside a
group; a row's *ordinal* is its position over all groups. Per group ``g``:

- ``"{g}/keys"`` (uint8) the UTF-8 keys concatenated, ``"{g}/key_lengths"``
  (int32) their byte lengths (version 2: of what follows each key's shared prefix);
- per field ``i``: ``"{g}/{i}/data"`` the arrays concatenated and
  ``"{g}/{i}/lengths"`` (int32) their lengths, or ``"{g}/{i}/values"`` the
  scalars (int64, float64 or bool). Since version 2, ``"{g}/key_shared"`` (uint8)
  is per key how many characters it shares with the key before it (keys are
  sorted: a canonical group's 16 row keys share its group id), and ``keys``
  holds only the rest of each key; and an array field whose
  rows have the lengths of an earlier array field's rows has no lengths
  tensor: the group's ``shared_lengths`` lists it as ``[i, j]``, and field
  ``j``'s lengths are its. A token row's arrays (ids, logprobs, mask, weight
  versions, advantages) are one length each: 4 bytes per row per field that
  version 1 wrote again (~5 KB of a ~600 KB snapshot's rows, issue 16).

The safetensors ``__metadata__`` holds ``rollvault_segment``, a JSON
:class:`SegmentHeader`: version, partition, and each group's row count and
fields. Columns rather than a JSON entry per row: per row the file adds only
its key and 4 bytes per array field, so a segment is within a few percent of
the rows' own bytes (a JSON row entry was ~25% of a typical row).

**Writing** is atomic and durable (:func:`~rollvault.durable.fsync.atomic_write_bytes`:
temporary, fsync, rename, fsync of the directory), so a segment under its
final name is always complete, and a snapshot that names it is committed only
after it is durable. Nothing here executes code from the files.
"""

from __future__ import annotations

import enum
import operator
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, pairwise, repeat
from pathlib import Path
from typing import Annotated, Final

import msgspec
import numpy as np
import safetensors.numpy

from rollvault.dataplane.checkpoint_format import PartitionName, sha256_hex
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.rows import RowArray, RowDtype, RowValue, RowView, row_dtype
from rollvault.dataplane.segment_rows import Column, RowColumns, SegmentRow
from rollvault.durable.segment_store import publish_segment

SEGMENT_SCHEMA_VERSION: Final = 2
"""The version written: 2 shares equal lengths tensors between array fields and each key's
prefix with the key before it; 1 is still read."""
SUPPORTED_SEGMENT_SCHEMA_VERSIONS: Final = frozenset({1, 2})
SEGMENT_METADATA_KEY: Final = "rollvault_segment"
SEGMENT_FILE_SUFFIX: Final = ".segment.safetensors"
_MAX_LENGTH: Final = 2**31 - 1
_MAX_SHARED: Final = 255
"""Most characters a key's ``key_shared`` entry (uint8) takes from the key before it."""

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class FieldKind(enum.StrEnum):
    """What one field of a schema holds."""

    ARRAY = "array"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"


_SCALAR_DTYPES: Final = {
    FieldKind.INT: RowDtype.INT64,
    FieldKind.FLOAT: RowDtype.FLOAT64,
    FieldKind.BOOL: RowDtype.BOOL,
}


class FieldSpec(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """One field of a schema: ``[name, kind, dtype]`` (scalars: int64, float64, bool)."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    kind: FieldKind
    dtype: RowDtype


class SchemaGroup(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """Rows of one schema: how many, and their fields in row order."""

    rows: NonNegativeInt
    fields: list[FieldSpec]
    shared_lengths: list[tuple[NonNegativeInt, NonNegativeInt]] = msgspec.field(
        default_factory=list
    )
    """Version 2: ``(field, earlier field)``, an array field whose lengths tensor is the
    earlier array field's own (version 1 has none)."""

    def lengths_source(self) -> dict[int, int]:
        """Per array field sharing lengths, the field whose lengths tensor it reads."""
        return dict(self.shared_lengths)


class SegmentHeader(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The segment's own description, in its safetensors ``__metadata__``."""

    schema_version: int
    partition: PartitionName
    groups: list[SchemaGroup]

    @property
    def row_count(self) -> int:
        """Rows over all groups."""
        return sum(group.rows for group in self.groups)


@dataclass(frozen=True)
class WrittenSegment:
    """A durable segment: its file name, checksum, size and its rows' keys by ordinal."""

    file: str
    partition: str
    sha256: str
    byte_size: int
    keys: tuple[str, ...]

    @property
    def row_count(self) -> int:
        """Rows in the segment."""
        return len(self.keys)


def segment_file_name(stem: str, partition: str) -> str:
    """File name of the segment of ``partition`` that the snapshot named ``stem`` writes."""
    return f"{stem}-{partition}{SEGMENT_FILE_SUFFIX}"


def _field_spec(field: str, value: RowValue) -> FieldSpec:
    if isinstance(value, np.ndarray):
        return FieldSpec(field, FieldKind.ARRAY, row_dtype(value))
    # bool before int: a bool is an int too.
    if isinstance(value, bool):
        return FieldSpec(field, FieldKind.BOOL, RowDtype.BOOL)
    if isinstance(value, int):
        return FieldSpec(field, FieldKind.INT, RowDtype.INT64)
    return FieldSpec(field, FieldKind.FLOAT, RowDtype.FLOAT64)


_Shape = tuple[tuple[str, ...], tuple[type, ...]]
"""A row's field names and value types, in order: what most of its schema depends on."""


class _Schemas:
    """Each row's schema, built once per distinct row shape and array dtypes.

    Called for every row of a snapshot's new rows (thousands), on a snapshot
    thread that holds the GIL while it runs: a :class:`FieldSpec` per field and
    row was most of a segment's encoding. A row's names and value types are read
    with C-level calls; only its arrays' dtypes are read per row (``bool`` and
    ``int`` are distinct types, so the scalar kinds follow from the types).
    """

    def __init__(self) -> None:
        self._dtype_readers: dict[_Shape, Callable[[RowView], tuple[object, ...]]] = {}
        self._schemas: dict[tuple[_Shape, tuple[object, ...]], tuple[FieldSpec, ...]] = {}

    def of(self, row: RowView) -> tuple[FieldSpec, ...]:
        shape = (tuple(row), tuple(map(type, row.values())))
        reader = self._dtype_readers.get(shape)
        if reader is None:
            reader = self._dtype_readers[shape] = _dtype_reader(shape)
        signature = (shape, reader(row))
        schema = self._schemas.get(signature)
        if schema is None:
            schema = tuple(_field_spec(field, value) for field, value in row.items())
            self._schemas[signature] = schema
        return schema


def _dtype_reader(shape: _Shape) -> Callable[[RowView], tuple[object, ...]]:
    """Reads the dtypes of a row's array fields (of rows of ``shape``), in order."""
    names, types = shape
    arrays = [name for name, kind in zip(names, types, strict=True) if issubclass(kind, np.ndarray)]
    if not arrays:
        return lambda row: ()
    values = operator.itemgetter(*arrays)
    if len(arrays) == 1:
        return lambda row: (values(row).dtype,)
    dtype = operator.attrgetter("dtype")
    return lambda row: tuple(map(dtype, values(row)))


def encode_segment(
    partition: str, rows: Mapping[str, RowView], *, version: int = SEGMENT_SCHEMA_VERSION
) -> tuple[bytes, tuple[str, ...]]:
    """The bytes of a segment holding ``rows``, and its keys in ordinal order.

    ``version`` 1 writes every lengths tensor, as the writer before version 2 did
    (for tests of older segments)."""
    if version not in SUPPORTED_SEGMENT_SCHEMA_VERSIONS:
        raise ValueError(f"no segment schema_version {version}")
    by_schema: dict[tuple[FieldSpec, ...], list[str]] = {}
    schemas = _Schemas()
    for key in sorted(rows):
        by_schema.setdefault(schemas.of(rows[key]), []).append(key)
    tensors: dict[str, RowArray] = {}
    groups = []
    ordered: list[str] = []
    for index, (schema, keys) in enumerate(by_schema.items()):
        ordered += keys
        suffixes: list[str] = keys
        if version >= 2:
            shared_chars = _shared_prefixes(keys)
            suffixes = [key[n:] for key, n in zip(keys, shared_chars, strict=True)]
            tensors[f"{index}/key_shared"] = np.array(shared_chars, dtype=np.uint8)
        encoded_keys = [suffix.encode("utf-8") for suffix in suffixes]
        tensors[f"{index}/keys"] = np.frombuffer(b"".join(encoded_keys), dtype=np.uint8)
        tensors[f"{index}/key_lengths"] = _lengths([len(key) for key in encoded_keys])
        own_lengths: dict[tuple[int, ...], int] = {}
        shared: list[tuple[int, int]] = []
        for position, spec in enumerate(schema):
            values = [rows[key][spec.name] for key in keys]
            prefix = f"{index}/{position}"
            if spec.kind is FieldKind.ARRAY:
                arrays: list[RowArray] = values  # type: ignore[assignment]
                tensors[f"{prefix}/data"] = np.concatenate(arrays)
                lengths = tuple(array.shape[0] for array in arrays)
                source = own_lengths.get(lengths) if version >= 2 else None
                if source is None:
                    own_lengths[lengths] = position
                    tensors[f"{prefix}/lengths"] = _lengths(list(lengths))
                else:
                    shared.append((position, source))
            else:
                tensors[f"{prefix}/values"] = np.array(values, dtype=spec.dtype.value)
        groups.append(SchemaGroup(rows=len(keys), fields=list(schema), shared_lengths=shared))
    header = SegmentHeader(schema_version=version, partition=partition, groups=groups)
    metadata = {SEGMENT_METADATA_KEY: msgspec.json.encode(header).decode()}
    return safetensors.numpy.save(tensors, metadata=metadata), tuple(ordered)


def _shared_prefixes(keys: Sequence[str]) -> list[int]:
    """Per key (sorted), the characters it shares with the key before it, at most
    :data:`_MAX_SHARED` (the first shares none)."""
    shared = [0]
    for before, key in pairwise(keys):
        low, high = 0, min(len(before), len(key), _MAX_SHARED)
        while low < high:  # a binary search of C-level startswith, not a loop per character
            middle = (low + high + 1) // 2
            if key.startswith(before[:middle]):
                low = middle
            else:
                high = middle - 1
        shared.append(low)
    return shared


def _lengths(lengths: list[int]) -> RowArray:
    if lengths and max(lengths) > _MAX_LENGTH:
        raise ValueError(f"an array or key of {max(lengths)} elements does not fit a segment")
    return np.array(lengths, dtype=np.int32)


def write_segment(
    directory: Path, file: str, partition: str, rows: Mapping[str, RowView]
) -> WrittenSegment:
    """Write ``rows`` durably as ``directory/file``; return its record.

    ``directory`` is created (and its parent flushed) if absent. A file of
    that name is replaced: see :func:`~rollvault.durable.segment_store.publish_segment`.
    """
    data, keys = encode_segment(partition, rows)
    publish_segment(directory / file, data)
    return WrittenSegment(
        file=file, partition=partition, sha256=sha256_hex(data), byte_size=len(data), keys=keys
    )


@dataclass(frozen=True)
class SegmentRows:
    """A verified segment, decoded: its header and, for chosen ordinals, their rows."""

    header: SegmentHeader
    keys: tuple[str, ...]
    rows: dict[str, RowView]


def read_segment(
    path: Path,
    *,
    partition: str,
    sha256: str,
    byte_size: int,
    row_count: int,
    wanted: Sequence[bool] | None = None,
) -> SegmentRows:
    """Read and verify the segment at ``path`` against what a snapshot records of it.

    Returns the rows whose ordinal is true in ``wanted`` (all rows when None).
    Raises :class:`DataPlaneCheckpointError` naming the segment for a missing
    file, a size or checksum mismatch, or content that disagrees with its header
    or the snapshot's record.
    """
    data = read_segment_bytes(path, byte_size=byte_size)
    check_segment_digest(path, sha256_hex(data), sha256)
    return decode_segment(path, data, partition=partition, row_count=row_count, wanted=wanted)


def read_segment_bytes(path: Path, *, byte_size: int, what: str = "segment") -> bytes:
    """The bytes of the segment at ``path``, of the ``byte_size`` a snapshot records.

    The first step of :func:`read_segment`; nothing in them is trusted before
    :func:`check_segment_digest`. A missing or unreadable file or another size
    raises :class:`DataPlaneCheckpointError` naming the file (``what`` says its
    kind: a segment, or a segment catalog).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataPlaneCheckpointError(
            path, f"missing {what} (referenced by the snapshot)"
        ) from None
    except OSError as exc:
        raise DataPlaneCheckpointError(path, f"unreadable {what}: {exc}") from exc
    if len(data) != byte_size:
        raise DataPlaneCheckpointError(
            path,
            f"{what} size is {len(data)} bytes, the snapshot records {byte_size} "
            "(truncated or overwritten)",
        )
    return data


def check_segment_digest(path: Path, digest: str, sha256: str, *, what: str = "segment") -> None:
    """Refuse the segment at ``path`` unless its bytes' hex SHA-256 ``digest`` is the
    ``sha256`` a snapshot records (the digest may be computed elsewhere, in a worker
    thread; ``what`` as for :func:`read_segment_bytes`)."""
    if digest != sha256:
        raise DataPlaneCheckpointError(
            path, f"{what} checksum mismatch: SHA-256 is {digest}, the snapshot records {sha256}"
        )


def decode_segment(
    path: Path,
    data: bytes,
    *,
    partition: str,
    row_count: int,
    wanted: Sequence[bool] | None = None,
) -> SegmentRows:
    """The rows of a segment's ``data``, already checked against its recorded SHA-256.

    The last step of :func:`read_segment`: the header and content must agree
    with each other and with the snapshot's record (``partition``, ``row_count``,
    ``wanted``), else :class:`DataPlaneCheckpointError` names the segment.
    """
    header = _read_header(path, data)
    if header.partition != partition:
        raise DataPlaneCheckpointError(
            path, f"segment holds partition {header.partition!r}, the snapshot says {partition!r}"
        )
    if header.row_count != row_count:
        raise DataPlaneCheckpointError(
            path, f"segment holds {header.row_count} rows, the snapshot records {row_count}"
        )
    if wanted is not None and len(wanted) != row_count:  # rows would be skipped or cut
        raise DataPlaneCheckpointError(
            path, f"the snapshot says which of {len(wanted)} rows it holds, of {row_count}"
        )
    return _decode_rows(path, header, _tensor_views(path, data), wanted)


# The dtypes a segment's tensors may have, little-endian as safetensors stores them.
_SAFETENSORS_DTYPES: Final = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}


class _TensorEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One tensor of a safetensors header."""

    dtype: str
    shape: list[NonNegativeInt]
    data_offsets: tuple[NonNegativeInt, NonNegativeInt]


def _tensor_views(path: Path, data: bytes) -> dict[str, RowArray]:
    """The tensors of the safetensors file ``data``: read-only numpy views of its bytes.

    No copy: ``safetensors.numpy.load`` copied all ~16 MB of a restore's segments
    into fresh memory (~5 ms in a process's first restore, page faults included). The
    file is checked as that loader checks it: every tensor of a known dtype, its
    offsets its shape's bytes, the tensors back to back in offset order from the
    start of the data to the end of the file. Else :class:`DataPlaneCheckpointError`
    says the file is not a readable safetensors file, and why.
    """
    try:
        (length,) = struct.unpack_from("<Q", data)
        if 8 + length > len(data):
            raise ValueError(f"a header of {length} bytes in a file of {len(data)}")
        raw = msgspec.json.decode(data[8 : 8 + length], type=dict[str, object])
        raw.pop("__metadata__", None)
        entries = msgspec.convert(raw, dict[str, _TensorEntry])
        tensors = _views(data, 8 + length, entries)
    except (struct.error, msgspec.MsgspecError, ValueError) as exc:
        raise DataPlaneCheckpointError(path, f"not a readable safetensors file: {exc}") from exc
    return tensors


def _views(data: bytes, start: int, entries: Mapping[str, _TensorEntry]) -> dict[str, RowArray]:
    """Each entry's view of ``data``, whose tensors begin at ``start``; a gap, an overlap,
    an unknown dtype or offsets that disagree with a shape raise ``ValueError``."""
    tensors: dict[str, RowArray] = {}
    end = 0
    for name, entry in sorted(entries.items(), key=lambda item: item[1].data_offsets):
        dtype = _SAFETENSORS_DTYPES.get(entry.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r} has dtype {entry.dtype!r}, not one rows hold")
        begin, stop = entry.data_offsets
        count = int(np.prod(entry.shape, dtype=np.int64))
        if begin != end or stop - begin != count * dtype.itemsize:
            raise ValueError(
                f"tensor {name!r} at bytes {begin}-{stop}: expected {count * dtype.itemsize} "
                f"bytes from {end} for {entry.dtype}{entry.shape}"
            )
        view = np.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = view.reshape(entry.shape)
        end = stop
    if start + end != len(data):
        raise ValueError(f"its tensors end at byte {start + end} of {len(data)}")
    return tensors


def _read_header(path: Path, data: bytes) -> SegmentHeader:
    try:
        (length,) = struct.unpack_from("<Q", data)
        raw = msgspec.json.decode(data[8 : 8 + length], type=dict[str, object])
        text = msgspec.convert(raw.get("__metadata__"), dict[str, str])[SEGMENT_METADATA_KEY]
        header = msgspec.json.decode(text, type=SegmentHeader, strict=True)
    except (struct.error, msgspec.MsgspecError, KeyError, TypeError) as exc:
        raise DataPlaneCheckpointError(path, f"invalid segment header: {exc}") from exc
    if header.schema_version not in SUPPORTED_SEGMENT_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, sorted(SUPPORTED_SEGMENT_SCHEMA_VERSIONS)))
        raise DataPlaneCheckpointError(
            path,
            f"unsupported segment schema_version {header.schema_version} "
            f"(this build reads {readable})",
        )
    for index, group in enumerate(header.groups):
        _check_shared_lengths(path, header.schema_version, index, group)
    return header


def _check_shared_lengths(path: Path, version: int, index: int, group: SchemaGroup) -> None:
    """Each sharing field is an array field once, reading an earlier array field's own
    lengths tensor (never another sharer's: no chains, no cycles); version 1 shares none."""
    where = f"invalid segment header: groups[{index}].shared_lengths"
    if version < 2 and group.shared_lengths:
        raise DataPlaneCheckpointError(path, f"{where}: version {version} shares no lengths")
    sources = group.lengths_source()
    if len(sources) != len(group.shared_lengths):
        raise DataPlaneCheckpointError(path, f"{where}: a field is listed twice")
    arrays = {i for i, spec in enumerate(group.fields) if spec.kind is FieldKind.ARRAY}
    for field, source in group.shared_lengths:
        if field not in arrays or source not in arrays or source >= field or source in sources:
            raise DataPlaneCheckpointError(
                path,
                f"{where}: [{field}, {source}] is not an array field reading an earlier "
                "array field's own lengths",
            )


def _expected_tensors(header: SegmentHeader) -> set[str]:
    names = set()
    for index, group in enumerate(header.groups):
        names |= {f"{index}/keys", f"{index}/key_lengths"}
        if header.schema_version >= 2:
            names.add(f"{index}/key_shared")
        shared = group.lengths_source()
        for position, spec in enumerate(group.fields):
            suffixes: tuple[str, ...] = ("values",)
            if spec.kind is FieldKind.ARRAY:
                suffixes = ("data",) if position in shared else ("data", "lengths")
            names |= {f"{index}/{position}/{suffix}" for suffix in suffixes}
    return names


def _decode_rows(
    path: Path,
    header: SegmentHeader,
    tensors: Mapping[str, RowArray],
    wanted: Sequence[bool] | None,
) -> SegmentRows:
    expected = _expected_tensors(header)
    if set(tensors) != expected:
        raise DataPlaneCheckpointError(
            path,
            f"segment holds tensors {sorted(tensors)}, its header describes {sorted(expected)}",
        )
    keys: list[str] = []
    rows: dict[str, RowView] = {}
    ordinal = 0
    for index, group in enumerate(header.groups):
        group_keys = _group_keys(path, index, group, tensors)
        keep = None if wanted is None else wanted[ordinal : ordinal + group.rows]
        shared = group.lengths_source()
        bounds: dict[str, list[int]] = {}  # per lengths tensor: fields sharing it share them
        columns = RowColumns(
            [spec.name for spec in group.fields],
            [
                _column(
                    path,
                    f"{index}/{position}",
                    spec,
                    group.rows,
                    tensors,
                    bounds,
                    lengths_of=f"{index}/{shared.get(position, position)}",
                )
                for position, spec in enumerate(group.fields)
            ],
        )
        # Every column is checked whole above; each row is its ordinal until a field of
        # it is read (segment_rows): a restore uses the keys only.
        ordinals: Iterable[int] = range(group.rows)
        if keep is None:
            kept_keys = group_keys
        else:  # group.rows long: read_segment checked the list against the groups' rows
            kept_keys = list(compress(group_keys, keep))
            ordinals = compress(ordinals, keep)
        before = len(rows)
        rows.update(zip(kept_keys, map(SegmentRow, repeat(columns), ordinals), strict=True))
        if len(rows) != before + len(kept_keys):
            raise DataPlaneCheckpointError(
                path, f"segment holds key {_first_repeat(keys + group_keys)!r} twice"
            )
        keys += group_keys
        ordinal += group.rows
    if len(set(keys)) != len(keys):
        raise DataPlaneCheckpointError(path, f"segment holds key {_first_repeat(keys)!r} twice")
    return SegmentRows(header=header, keys=tuple(keys), rows=rows)


def _first_repeat(keys: Sequence[str]) -> str:
    """The first key of ``keys`` seen twice (called only once a repeat is known)."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no repeated key")  # pragma: no cover - callers checked


def _checked(path: Path, name: str, array: RowArray, dtype: RowDtype, length: int | None) -> None:
    if array.dtype.name != dtype.value or array.ndim != 1:
        raise DataPlaneCheckpointError(
            path,
            f"tensor {name!r} is {array.dtype.name}{list(array.shape)}, expected {dtype.value}",
        )
    if length is not None and array.shape[0] != length:
        raise DataPlaneCheckpointError(
            path, f"tensor {name!r} has {array.shape[0]} elements, its header implies {length}"
        )


def _bounds(path: Path, name: str, data: RowArray, lengths: RowArray) -> list[int]:
    """Row offsets into ``data``: row ``i`` is ``data[bounds[i]:bounds[i + 1]]``."""
    if (lengths < 0).any() or int(lengths.sum(dtype=np.int64)) != data.shape[0]:
        raise _unequal_lengths(path, name, data)
    bounds: list[int] = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))).tolist()
    return bounds


def _unequal_lengths(path: Path, name: str, data: RowArray) -> DataPlaneCheckpointError:
    return DataPlaneCheckpointError(
        path, f"tensor {name!r}: its lengths do not add up to its {data.shape[0]} elements"
    )


def _readonly(data: RowArray) -> RowArray:
    """``data``, or a read-only view of it: the rows' arrays are views of it and inherit it."""
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False
    return data


def _group_keys(
    path: Path, index: int, group: SchemaGroup, tensors: Mapping[str, RowArray]
) -> list[str]:
    raw, lengths = tensors[f"{index}/keys"], tensors[f"{index}/key_lengths"]
    _checked(path, f"{index}/keys", raw, RowDtype.UINT8, None)
    _checked(path, f"{index}/key_lengths", lengths, RowDtype.INT32, group.rows)
    bounds = _bounds(path, f"{index}/keys", raw, lengths)
    blob = raw.tobytes()
    try:
        if blob.isascii():
            # Byte offsets are character offsets: decode once, slice the str.
            text = blob.decode("ascii")
            keys = [text[start:end] for start, end in pairwise(bounds)]
        else:
            keys = [blob[start:end].decode("utf-8") for start, end in pairwise(bounds)]
    except UnicodeDecodeError as exc:
        raise DataPlaneCheckpointError(path, f"tensor '{index}/keys': not UTF-8: {exc}") from exc
    shared = tensors.get(f"{index}/key_shared")
    if shared is not None:  # version 2: each key is its suffix after what it shares
        _checked(path, f"{index}/key_shared", shared, RowDtype.UINT8, group.rows)
        keys = _unshared(path, index, keys, shared.tolist())
    if not all(keys):
        raise DataPlaneCheckpointError(path, f"tensor '{index}/keys' holds an empty key")
    return keys


def _unshared(path: Path, index: int, suffixes: list[str], shared: list[int]) -> list[str]:
    """The keys whose suffixes are ``suffixes``, each after ``shared`` characters of the
    key before it."""
    keys = []
    before = ""
    for position, (suffix, count) in enumerate(zip(suffixes, shared, strict=True)):
        if count > len(before):
            raise DataPlaneCheckpointError(
                path,
                f"tensor '{index}/key_shared'[{position}]: {count} characters of a key of "
                f"{len(before)}",
            )
        before = before[:count] + suffix
        keys.append(before)
    return keys


def _column(
    path: Path,
    prefix: str,
    spec: FieldSpec,
    rows: int,
    tensors: Mapping[str, RowArray],
    bounds: dict[str, list[int]],
    *,
    lengths_of: str,
) -> Column:
    """The field's column, checked whole: an array field's data and each row's offsets
    into it (its lengths are those of the field ``lengths_of``: its own prefix, or the
    earlier field whose lengths it shares; ``bounds`` keeps each lengths tensor's
    offsets, computed once), or a scalar field's values.

    The rows' arrays will be read-only views of the data, itself a view of the
    segment's bytes as read, not copies: a copy per row cost more than the rest of a
    restore's row load. The price is memory: a segment's bytes are freed once the
    last of its rows is cleared, so rows restored from one segment hold at most
    what the restore read, never more.
    """
    if spec.kind is FieldKind.ARRAY:
        data, lengths = tensors[f"{prefix}/data"], tensors[f"{lengths_of}/lengths"]
        _checked(path, f"{prefix}/data", data, spec.dtype, None)
        _checked(path, f"{lengths_of}/lengths", lengths, RowDtype.INT32, rows)
        offsets = bounds.get(lengths_of)
        if offsets is None:
            offsets = bounds[lengths_of] = _bounds(path, f"{prefix}/data", data, lengths)
        elif offsets[-1] != data.shape[0]:
            raise _unequal_lengths(path, f"{prefix}/data", data)
        return _readonly(data), offsets
    values = tensors[f"{prefix}/values"]
    if spec.dtype is not _SCALAR_DTYPES[spec.kind]:
        raise DataPlaneCheckpointError(
            path, f"field {spec.name!r}: a {spec.kind.value} scalar stored as {spec.dtype.value}"
        )
    _checked(path, f"{prefix}/values", values, spec.dtype, rows)
    if spec.kind is FieldKind.FLOAT and not np.isfinite(values).all():
        raise DataPlaneCheckpointError(path, f"field {spec.name!r}: a float scalar is not finite")
    return values


def segment_files(directory: Path) -> list[str]:
    """Names of the segment files in ``directory`` (none if it does not exist), sorted."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(SEGMENT_FILE_SUFFIX))
