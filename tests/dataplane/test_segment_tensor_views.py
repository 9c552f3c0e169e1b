"""A row segment's tensors are read as views of the bytes read, not copied (issue 16): the
same arrays safetensors' own loader gives, read-only, and a file whose tensor table is not
one safetensors would accept is refused naming the segment."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from dataplane_helpers import sample_row

from rollvault.dataplane import STAGING_PARTITION, DataPlaneCheckpointError
from rollvault.dataplane.rows import validate_row
from rollvault.dataplane.segments import decode_segment, encode_segment

PATH = Path("segments/000001-rollout_staging.segment.safetensors")


def _segment() -> bytes:
    rows = {f"r{n}": sample_row(n, length=n) for n in range(4)}  # r0's arrays are empty
    rows["s"] = {"only": 3, "f": 0.25, "ok": True}
    data, _keys = encode_segment(
        STAGING_PARTITION,
        {key: validate_row(STAGING_PARTITION, key, row) for key, row in rows.items()},
    )
    return data


def _decode(data: bytes) -> dict[str, Any]:
    return dict(decode_segment(PATH, data, partition=STAGING_PARTITION, row_count=5).rows)


def test_the_rows_are_views_of_the_bytes_read_equal_to_what_safetensors_loads() -> None:
    data = _segment()
    rows = _decode(data)
    expected = safetensors.numpy.load(data)
    assert expected["0/0/data"].size > 0
    (token_row_group,) = [g for g in range(2) if f"{g}/0/lengths" in expected]
    column = np.concatenate([rows[f"r{n}"]["input_ids"] for n in range(4)])
    np.testing.assert_array_equal(column, expected[f"{token_row_group}/0/data"])
    assert column.dtype == expected[f"{token_row_group}/0/data"].dtype
    view = rows["r3"]["input_ids"]
    assert not view.flags.writeable
    assert np.shares_memory(view, np.frombuffer(data, dtype=np.uint8))
    assert rows["s"] == {"only": 3, "f": 0.25, "ok": True}


def _table(data: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack_from("<Q", data)
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _rebuilt(table: dict[str, Any], body: bytes) -> bytes:
    header = json.dumps(table).encode()
    return struct.pack("<Q", len(header)) + header + body


def _tensor(table: dict[str, Any], index: int) -> dict[str, Any]:
    """The ``index``-th tensor of ``table`` in offset order."""
    names = sorted((v["data_offsets"], k) for k, v in table.items() if k != "__metadata__")
    entry: dict[str, Any] = table[names[index][1]]
    return entry


def _gap(table: dict[str, Any], body: bytes) -> bytes:
    _tensor(table, 1)["data_offsets"][0] += 1
    return _rebuilt(table, body)


def _longer(table: dict[str, Any], body: bytes) -> bytes:
    last = _tensor(table, -1)
    last["data_offsets"][1] += 1
    return _rebuilt(table, body)


def _trailing(table: dict[str, Any], body: bytes) -> bytes:
    return _rebuilt(table, body + b"\0")


def _dtype(table: dict[str, Any], body: bytes) -> bytes:
    _tensor(table, 0)["dtype"] = "BF16"
    return _rebuilt(table, body)


def _shape(table: dict[str, Any], body: bytes) -> bytes:
    _tensor(table, 0)["shape"][0] += 1
    return _rebuilt(table, body)


def _unknown_field(table: dict[str, Any], body: bytes) -> bytes:
    _tensor(table, 0)["strides"] = [1]
    return _rebuilt(table, body)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_gap, "expected"),
        (_longer, "bytes"),
        (_trailing, "its tensors end at byte"),
        (_dtype, "'BF16', not one rows hold"),
        (_shape, "expected"),
    ],
)
def test_a_tensor_table_safetensors_would_refuse_is_refused_naming_the_segment(
    damage: Callable[[dict[str, Any], bytes], bytes], message: str
) -> None:
    data = damage(*_table(_segment()))
    with pytest.raises(safetensors.SafetensorError):
        safetensors.numpy.load(data)  # the loader this one replaces refuses it too
    with pytest.raises(DataPlaneCheckpointError, match="not a readable safetensors file") as caught:
        _decode(data)
    assert caught.value.path == PATH
    assert message in caught.value.problem


def test_a_tensor_entry_with_a_field_safetensors_does_not_write_is_refused() -> None:
    """Stricter than safetensors' loader, which ignores it: the writer never writes one."""
    data = _unknown_field(*_table(_segment()))
    with pytest.raises(DataPlaneCheckpointError, match="not a readable safetensors file") as caught:
        _decode(data)
    assert caught.value.path == PATH and "strides" in caught.value.problem
