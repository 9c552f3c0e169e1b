"""Token rows: the values the data plane stores, and their validation.

A row maps field names to 1-D numpy arrays (input ids, generation logprobs,
token masks, ...) or to scalars (``int``, ``float``, ``bool``). Rows are
validated when they are put, never later: every error names the partition,
the key and the field.

A stored row is immutable. ``put`` copies each array once and marks the copy
read-only, so later writes into the caller's buffers cannot change a stored
row, and ``get`` and ``capture`` can hand out references without copying.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from rollvault.dataplane.errors import DataPlaneValidationError

RowArray = npt.NDArray[Any]
RowValue = RowArray | int | float | bool
Row = dict[str, RowValue]
"""What callers put and get: field name to 1-D array or scalar."""
RowView = Mapping[str, RowValue]
"""A stored row: a read-only mapping whose arrays are read-only too."""
RowInput = Mapping[str, RowValue | np.bool_ | np.integer[Any] | np.floating[Any]]
"""What ``put`` accepts: numpy scalars are stored as the matching Python scalar."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_PARTITION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class RowDtype(StrEnum):
    """Array dtypes a row may hold: those safetensors stores natively."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"


# Keyed by numpy dtype (native byte order): a dict lookup is ~40x cheaper than
# ``dtype.name``, which matters at tens of thousands of arrays per checkpoint.
_ROW_DTYPES: dict[np.dtype[Any], RowDtype] = {np.dtype(dtype.value): dtype for dtype in RowDtype}


def row_dtype(array: RowArray) -> RowDtype:
    """The :class:`RowDtype` of a stored (validated, native byte order) array."""
    return _ROW_DTYPES[array.dtype]


def check_partition_name(partition: object) -> str:
    """Return ``partition`` if it is a valid partition name, else raise.

    Partition names become file names in a checkpoint, so they are limited to
    letters, digits, ``_``, ``.`` and ``-`` and may not start with ``.`` or ``-``.
    """
    if not isinstance(partition, str) or not _PARTITION_NAME.fullmatch(partition):
        raise DataPlaneValidationError(
            f"invalid partition name {partition!r}: expected 1-128 characters from "
            "[A-Za-z0-9_.-], not starting with '.' or '-'"
        )
    return partition


def check_key(partition: str, key: object) -> str:
    """Return ``key`` if it is a valid row key, else raise naming the partition."""
    return _checked_text(key, f"partition {partition!r}: row key")


def _checked_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise DataPlaneValidationError(f"{what} must be a non-empty str, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataPlaneValidationError(f"{what} {value!r} is not encodable as UTF-8") from exc
    return value


def validate_row(partition: str, key: str, row: object) -> RowView:
    """Check one row and return its immutable stored form.

    Arrays are copied once into native byte order, C order, and marked
    read-only; numpy scalars become the matching Python scalar.
    """
    where = f"partition {partition!r}, key {key!r}"
    if not isinstance(row, Mapping):
        raise DataPlaneValidationError(
            f"{where}: a row must be a mapping of field name to value, got {type(row).__name__}"
        )
    stored: dict[str, RowValue] = {}
    for field, value in row.items():
        if type(field) is not str or field not in _CHECKED_FIELD_NAMES:
            _checked_text(field, f"{where}: field name")
            if len(_CHECKED_FIELD_NAMES) < _MAX_CHECKED_FIELD_NAMES:
                _CHECKED_FIELD_NAMES.add(field)
        stored[field] = validate_value(value, f"{where}, field {field!r}")
    return MappingProxyType(stored)


# Rows of a run share a handful of field names; checking each name once saves
# a UTF-8 encode per field of every row (tens of thousands of rows per minute).
# Bounded, so that rows with generated field names cannot grow it without end.
_CHECKED_FIELD_NAMES: set[str] = set()
_MAX_CHECKED_FIELD_NAMES = 1024


def validate_value(value: object, where: str) -> RowValue:
    """Return the stored form of one row value; ``where`` prefixes any error."""
    kind = type(value)
    # Exact-type fast paths (every staged and published row passes here).
    if kind is np.ndarray:
        return _stored_array(value, where)  # type: ignore[arg-type]
    if kind is bool:
        return value  # type: ignore[return-value]
    if kind is float:
        return _checked_float(value, where)  # type: ignore[arg-type]
    if isinstance(value, np.ndarray):
        return _stored_array(value, where)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return _checked_int(int(value), where)
    if isinstance(value, float | np.floating):
        return _checked_float(float(value), where)
    raise DataPlaneValidationError(
        f"{where}: unsupported value of type {type(value).__name__}; a row value is a "
        "1-D numpy array or an int, float or bool scalar"
    )


def _stored_array(value: RowArray, where: str) -> RowArray:
    if value.ndim != 1:
        raise DataPlaneValidationError(
            f"{where}: arrays must be 1-D, got shape {value.shape} "
            "(use a Python scalar for a single value)"
        )
    if value.dtype in _ROW_DTYPES:
        stored = value.copy(order="C")
    elif value.dtype.newbyteorder("=") in _ROW_DTYPES:
        stored = value.astype(value.dtype.newbyteorder("="), order="C")
    else:
        allowed = ", ".join(dtype.value for dtype in RowDtype)
        raise DataPlaneValidationError(
            f"{where}: unsupported array dtype {value.dtype}; allowed: {allowed}"
        )
    stored.flags.writeable = False
    return stored


def _checked_int(value: int, where: str) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise DataPlaneValidationError(f"{where}: int scalar {value} does not fit in int64")
    return value


def _checked_float(value: float, where: str) -> float:
    if not math.isfinite(value):
        raise DataPlaneValidationError(
            f"{where}: float scalar {value} is not finite (scalars are stored as JSON)"
        )
    return value


def row_difference(stored: RowView, new: RowView) -> str | None:
    """Describe the first difference between two stored rows, or ``None`` if identical.

    Identical means the same fields, and for each field the same scalar type
    and value, or the same array dtype, length and bytes (so NaN equals the
    same NaN, and ``-0.0`` differs from ``0.0``).
    """
    if stored.keys() != new.keys():
        return f"fields differ: stored {sorted(stored)}, new {sorted(new)}"
    for field, old_value in stored.items():
        problem = _value_difference(old_value, new[field])
        if problem is not None:
            return f"field {field!r}: {problem}"
    return None


def _value_difference(old: RowValue, new: RowValue) -> str | None:
    if isinstance(old, np.ndarray) and isinstance(new, np.ndarray):
        if old.dtype != new.dtype:
            return f"dtype {old.dtype} stored, {new.dtype} new"
        if old.shape != new.shape:
            return f"length {old.shape[0]} stored, {new.shape[0]} new"
        if not np.array_equal(old.view(np.uint8), new.view(np.uint8)):
            return "array values differ"
        return None
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        return f"{type(old).__name__} stored, {type(new).__name__} new"
    if type(old) is not type(new):
        return f"{type(old).__name__} stored, {type(new).__name__} new"
    if isinstance(old, float) and isinstance(new, float):
        # Bitwise: 0.0 and -0.0 compare equal but are different rows.
        same = old.hex() == new.hex()
    else:
        same = old == new
    return None if same else f"{old!r} stored, {new!r} new"
