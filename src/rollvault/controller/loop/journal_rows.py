"""Staged rows as the seal journal stores them: one row at a time, or a batch in columns.

A seal record carries its rows one by one (:func:`encode_row`: each array as
its dtype and raw little-endian bytes). A batch of seals (one generation
batch's) carries its rows in columns instead (:func:`pack_rows`): the rows
with the same fields form a :class:`RowBlock`, and each of its fields is one
:class:`ArrayColumn` (every row's array concatenated, with each row's length)
or one :class:`ValueColumn` (the rows' values as :func:`encode_row` stores
them: scalars, and arrays whose dtype or shape differ from the first row's).
Packing a column is a few C calls instead of a Struct and a copy per array,
which is most of what journaling a seal costs the writer thread; unpacking
(:func:`unpack_rows`) gives back exactly the rows :func:`encode_row` would
have stored, so replay reads both forms alike.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter, methodcaller
from typing import Annotated, Final

import msgspec
import numpy as np

from rollvault.dataplane.rows import Row, RowDtype, RowView, row_dtype

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_LITTLE_ENDIAN_HOST: Final = sys.byteorder == "little"
_PLAIN_SCALARS: Final = frozenset((bool, int, float))
_ARRAY_TYPE: Final = frozenset((np.ndarray,))
_DTYPE: Final = attrgetter("dtype")
_VALUES: Final = methodcaller("values")


class SealJournalRecordError(ValueError):
    """A journal record passed its CRC but is not a record this rollvault reads."""


class JournalArray(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A 1-D row array: its dtype and its raw little-endian bytes."""

    dtype: RowDtype
    data: bytes


JournalValue = JournalArray | bool | int | float
JournalRow = dict[str, JournalValue]


class ArrayColumn(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="arrays"
):
    """One field of a block whose every row holds a 1-D array of one dtype."""

    dtype: RowDtype
    data: bytes
    """The rows' arrays, concatenated in the block's row order, little-endian."""
    lengths: list[_NonNegativeInt]
    """Each row's array length (elements, not bytes)."""


class ValueColumn(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="values"
):
    """One field of a block as a value per row (scalars, or arrays that do not stack)."""

    values: list[JournalValue]


JournalColumn = ArrayColumn | ValueColumn


class RowBlock(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """The rows of a batch that have the same fields, in the same order, column by column."""

    positions: list[_NonNegativeInt]
    """Where each of the block's rows stands in the batch's row order."""
    columns: dict[str, JournalColumn]


def encode_value(value: object) -> JournalValue:
    """One row field as a journal value (an array as dtype + little-endian bytes)."""
    if isinstance(value, np.ndarray):
        return JournalArray(dtype=_row_dtype(value), data=_little_endian_bytes(value))
    if isinstance(value, np.generic):
        # A gate's own row (not yet the data plane's stored form) may hold numpy scalars.
        return value.item()
    return value  # type: ignore[return-value]


def _little_endian_bytes(array: np.ndarray) -> bytes:
    # Little-endian on disk: a native array on a little-endian host is copied out as
    # it is (no byte-order dtype built per array: this is the seal path).
    if _LITTLE_ENDIAN_HOST and array.dtype.isnative:
        return array.tobytes()
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _row_dtype(array: np.ndarray) -> RowDtype:
    # row_dtype knows native byte order only (the data plane's stored form); a gate's
    # own array may be big-endian, and is stored little-endian like any other.
    if array.dtype.isnative:
        return row_dtype(array)
    return RowDtype(array.dtype.newbyteorder("=").name)


def encode_row(row: RowView) -> JournalRow:
    """A stored row as journal values (arrays as dtype + bytes)."""
    return {name: encode_value(value) for name, value in row.items()}


def encode_rows(rows: Mapping[str, RowView], keys: list[str]) -> dict[str, JournalRow]:
    """The journal rows of ``keys`` (a receipt's staging keys, in its order)."""
    return {key: encode_row(rows[key]) for key in keys}


def decode_row(row: Mapping[str, JournalValue], *, where: str) -> Row:
    """The row a journal row describes; arrays whose bytes do not fit their dtype are refused."""
    out: Row = {}
    for name, value in row.items():
        if isinstance(value, JournalArray):
            dtype = np.dtype(value.dtype.value).newbyteorder("<")
            if len(value.data) % dtype.itemsize:
                raise SealJournalRecordError(
                    f"{where}: field {name!r}: {len(value.data)} bytes are not a whole number "
                    f"of {value.dtype.value} values"
                )
            # The data plane copies what it stores, so a read-only view suffices here.
            array = np.frombuffer(value.data, dtype=dtype)
            out[name] = array.astype(dtype.newbyteorder("="), copy=False)
        else:
            out[name] = value
    return out


def pack_rows(rows: Sequence[RowView]) -> list[RowBlock]:
    """``rows`` in columns: one block per set of fields (a batch usually has one)."""
    fields = list(map(tuple, rows))
    if fields and fields.count(fields[0]) == len(fields):
        # The usual batch: every row has the same fields in the same order (compared in
        # C, not per row), so one transpose of the rows' values gives every column at
        # once, instead of a pass over the rows per field.
        columns = zip(*map(_VALUES, rows), strict=True)
        return [
            RowBlock(
                positions=list(range(len(fields))),
                columns=dict(zip(fields[0], map(_column, columns), strict=True)),
            )
        ]
    by_fields: dict[tuple[str, ...], list[int]] = {}
    for position, names in enumerate(fields):
        by_fields.setdefault(names, []).append(position)
    blocks = []
    for names, positions in by_fields.items():
        block_rows = [rows[position] for position in positions]
        columns_by_name = {
            name: _column(tuple(map(itemgetter(name), block_rows))) for name in names
        }
        blocks.append(RowBlock(positions=positions, columns=columns_by_name))
    return blocks


def _column(values: tuple[object, ...]) -> JournalColumn:
    types = set(map(type, values))
    if types == _ARRAY_TYPE and len(set(map(_DTYPE, values))) == 1:
        stacked = _stacked(values)  # type: ignore[arg-type]
        if stacked is not None:
            return ArrayColumn(
                dtype=_row_dtype(stacked),
                data=_little_endian_bytes(stacked),
                lengths=list(map(len, values)),  # type: ignore[arg-type]
            )
    elif types <= _PLAIN_SCALARS:
        return ValueColumn(values=list(values))  # type: ignore[arg-type]
    return ValueColumn(values=[encode_value(v) for v in values])


def _stacked(arrays: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """The 1-D arrays of one dtype concatenated (None: not all of them are 1-D).

    Asked of the result instead of each array's ``ndim``: arrays of mixed or zero
    dimensions do not concatenate at all, and arrays that all have two or more
    concatenate to an array of that many.
    """
    try:
        stacked = np.concatenate(arrays)
    except ValueError:
        return None
    return stacked if stacked.ndim == 1 else None


def unpack_rows(blocks: list[RowBlock], count: int, *, where: str) -> list[JournalRow]:
    """The ``count`` rows :func:`pack_rows` packed, in order, as :func:`encode_row` gives them.

    A block whose columns disagree on their row count, a position out of range
    or taken twice, and a row no block holds are refused, naming ``where``.
    """
    rows: list[JournalRow | None] = [None] * count
    for number, block in enumerate(blocks):
        here = f"{where}, row block {number}"
        block_rows: list[JournalRow] = [{} for _ in block.positions]
        for name, column in block.columns.items():
            values = _column_values(column, len(block_rows), where=f"{here}, field {name!r}")
            for row, value in zip(block_rows, values, strict=True):
                row[name] = value
        for position, row in zip(block.positions, block_rows, strict=True):
            if position >= count or rows[position] is not None:
                raise SealJournalRecordError(
                    f"{here}: row position {position} is out of range or taken twice "
                    f"(the batch has {count} rows)"
                )
            rows[position] = row
    missing = [position for position, row in enumerate(rows) if row is None]
    if missing:
        raise SealJournalRecordError(f"{where}: no row block holds rows {missing[:5]}")
    return rows  # type: ignore[return-value]


def _column_values(column: JournalColumn, count: int, *, where: str) -> list[JournalValue]:
    if isinstance(column, ValueColumn):
        if len(column.values) != count:
            raise SealJournalRecordError(f"{where}: {len(column.values)} values for {count} rows")
        return column.values
    itemsize = np.dtype(column.dtype.value).itemsize
    if len(column.lengths) != count or sum(column.lengths) * itemsize != len(column.data):
        raise SealJournalRecordError(
            f"{where}: {len(column.lengths)} lengths summing to {sum(column.lengths)} "
            f"{column.dtype.value} values for {count} rows and {len(column.data)} bytes"
        )
    values: list[JournalValue] = []
    offset = 0
    data = column.data
    for length in column.lengths:
        end = offset + length * itemsize
        values.append(JournalArray(dtype=column.dtype, data=data[offset:end]))
        offset = end
    return values
