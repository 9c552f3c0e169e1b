"""A segment's rows as read: each row's mapping built from its columns when first read.

A restore reads every row of the snapshot's segments (~9.5k at 1,024 x 16) and
checks them column by column (dtypes, lengths, finite floats: see
:func:`~rollvault.dataplane.segments.decode_segment`), but uses only their keys
(orphan and missing-row checks); a row's fields are read later, once, when the
run finalizes or trains on it. Building each row's mapping at load (a view per
array field, a dict, a read-only proxy) was ~1 us per row, most of the rows'
part of a restore. Here a row is its columns and its ordinal until a field is
asked for; the mapping it then builds is the one the load built before (the
same field order, the same read-only views of the segment's bytes, the same
Python scalars), and it is kept, so every later read sees the same objects.

Nothing is left unchecked by the deferral: every check is of a whole column
and runs when the segment is decoded. Only the slicing and the mapping wait.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Final

from rollvault.dataplane.rows import RowArray, RowValue

ArrayColumn = tuple[RowArray, Sequence[int]]
"""An array field's column: the rows' arrays concatenated (read-only) and the offsets of
row ``i``'s array, ``bounds[i]:bounds[i + 1]``."""
Column = ArrayColumn | RowArray
"""A field's column: an array field's (:data:`ArrayColumn`), or a scalar field's values
(a 1-D array, one value per row)."""


class RowColumns:
    """The checked columns of one schema group of a segment, shared by its rows."""

    __slots__ = ("_names", "_columns")

    def __init__(self, names: Sequence[str], columns: Sequence[Column]) -> None:
        self._names: Final = tuple(names)
        self._columns: Final = tuple(columns)

    def row(self, ordinal: int) -> dict[str, RowValue]:
        """Row ``ordinal``'s fields in schema order: a view of its slice of each array
        column, the Python scalar of each scalar column (what ``tolist`` gives)."""
        values: dict[str, RowValue] = {}
        for name, column in zip(self._names, self._columns, strict=True):
            if type(column) is tuple:
                data, bounds = column
                values[name] = data[bounds[ordinal] : bounds[ordinal + 1]]
            else:
                values[name] = column.item(ordinal)  # type: ignore[union-attr]
        return values


class SegmentRow(Mapping[str, RowValue]):
    """One stored row of a segment: read-only, its mapping built on first read and kept.

    It compares equal to any mapping with the same fields and values, as the
    read-only ``MappingProxyType`` rows the load built before did; its arrays
    are read-only views of the segment's bytes.
    """

    __slots__ = ("_columns", "_ordinal", "_values")

    def __init__(self, columns: RowColumns, ordinal: int) -> None:
        self._columns = columns
        self._ordinal = ordinal
        self._values: dict[str, RowValue] | None = None

    def _row(self) -> dict[str, RowValue]:
        values = self._values
        if values is None:
            # Two threads may build it at once (a snapshot writer reads captured rows
            # off the event loop): both build equal mappings of the same bytes, and
            # whichever is kept, every field is a read-only view of the same data.
            values = self._values = self._columns.row(self._ordinal)
        return values

    def __getitem__(self, field: str) -> RowValue:
        return self._row()[field]

    def __iter__(self) -> Iterator[str]:
        return iter(self._row())

    def __len__(self) -> int:
        return len(self._row())

    def __contains__(self, field: object) -> bool:
        return field in self._row()

    def keys(self) -> KeysView[str]:
        return self._row().keys()

    def items(self) -> ItemsView[str, RowValue]:
        return self._row().items()

    def values(self) -> ValuesView[RowValue]:
        return self._row().values()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentRow):
            other = other._row()
        elif not isinstance(other, dict):
            if not isinstance(other, Mapping):
                return NotImplemented
            other = dict(other.items())  # as Mapping's own __eq__ compares
        return self._row() == other

    __hash__ = None  # type: ignore[assignment]  # a mapping: unhashable, as a dict

    def __repr__(self) -> str:
        return f"SegmentRow({self._row()!r})"
