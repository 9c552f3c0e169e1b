"""One row as TransferQueue holds it: a byte payload there, a small layout here.

TransferQueue stores batches of tensors; a row of the data plane is a mapping
of fields to 1-D arrays of a dozen dtypes and to scalars, different from row
to row. Each row is therefore sent as a single ``uint8`` tensor, the bytes of
its arrays concatenated, and the controller keeps its :class:`RowLayout`
(field names, dtypes, lengths, and the scalars themselves: a few bytes per
field). This keeps every dtype, byte order and bit pattern exact (NaN
payloads and ``-0.0`` included) without TransferQueue having to understand
them, and only keys and small metadata stay on the controller.

The layout plus the payload have a digest, so a repeated put is told from a
conflicting one without fetching the stored row back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import msgspec
import numpy as np
import numpy.typing as npt

from rollvault.dataplane.checkpoint_format import ArrayFieldEntry, ScalarFieldEntry
from rollvault.dataplane.errors import DataPlaneFieldError
from rollvault.dataplane.rows import RowValue, RowView, row_dtype

FieldEntry = ArrayFieldEntry | ScalarFieldEntry
_LAYOUT_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class RowLayout:
    """A row's fields in their put order: arrays as (field, dtype, length), scalars by value."""

    fields: tuple[FieldEntry, ...]

    def names(self) -> list[str]:
        """Field names in put order."""
        return [entry.field for entry in self.fields]

    @property
    def payload_size(self) -> int:
        """Bytes of the row's arrays, concatenated."""
        return sum(
            entry.length * np.dtype(entry.dtype.value).itemsize
            for entry in self.fields
            if isinstance(entry, ArrayFieldEntry)
        )


@dataclass(frozen=True, slots=True)
class EncodedRow:
    """A validated row split into what TransferQueue stores and what the controller keeps."""

    layout: RowLayout
    payload: bytes
    digest: bytes


def encode_row(row: RowView) -> EncodedRow:
    """Split a validated (stored-form) row into layout and payload."""
    fields: list[FieldEntry] = []
    chunks: list[bytes] = []
    for field, value in row.items():
        if isinstance(value, np.ndarray):
            fields.append(ArrayFieldEntry(field, row_dtype(value), value.shape[0]))
            chunks.append(value.tobytes())
        else:
            fields.append(ScalarFieldEntry(field, value))
    layout = RowLayout(tuple(fields))
    payload = b"".join(chunks)
    # JSON keeps true, 1 and 1.0 apart and writes -0.0 as such: equal digests
    # mean identical rows in the sense of ``row_difference``.
    digest = hashlib.blake2b(_LAYOUT_ENCODER.encode(fields), digest_size=16)
    digest.update(payload)
    return EncodedRow(layout=layout, payload=payload, digest=digest.digest())


def decode_row(
    layout: RowLayout, payload: npt.NDArray[np.uint8], fields: Sequence[str] | None = None
) -> RowView:
    """The stored row of ``layout`` and ``payload`` (all fields, or only ``fields``).

    Each array is copied out of the payload and made read-only, so it owns its
    memory and is aligned for its dtype.
    """
    wanted = None if fields is None else set(fields)
    values: dict[str, RowValue] = {}
    offset = 0
    for entry in layout.fields:
        if isinstance(entry, ArrayFieldEntry):
            dtype = np.dtype(entry.dtype.value)
            end = offset + entry.length * dtype.itemsize
            if wanted is None or entry.field in wanted:
                array = payload[offset:end].view(dtype).copy()
                array.flags.writeable = False
                values[entry.field] = array
            offset = end
        elif wanted is None or entry.field in wanted:
            values[entry.field] = entry.value
    if fields is not None:
        values = {field: values[field] for field in fields}
    return MappingProxyType(values)


def check_fields(partition: str, key: str, layout: RowLayout, fields: Sequence[str]) -> None:
    """Raise ``DataPlaneFieldError`` for the first of ``fields`` the row does not have."""
    names = layout.names()
    for field in fields:
        if field not in names:
            raise DataPlaneFieldError(
                f"partition {partition!r}, key {key!r} has no field {field!r} "
                f"(fields: {sorted(names)})"
            )
