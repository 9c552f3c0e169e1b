"""Row segments of schema version 2 (issue 16): array fields whose rows have the lengths of
an earlier array field's rows share its lengths tensor (a token row's arrays are one
length each), rows come back exactly, version 1 segments (a lengths tensor per array
field) are still read, and a header whose sharing is impossible, or of an unknown
version, is refused naming the segment."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from dataplane_helpers import assert_rows_identical, sample_row

from rollvault.dataplane import STAGING_PARTITION, DataPlaneCheckpointError, Row
from rollvault.dataplane.checkpoint_format import sha256_hex
from rollvault.dataplane.rows import RowView, validate_row
from rollvault.dataplane.segments import SEGMENT_METADATA_KEY, encode_segment, read_segment


def _rows() -> dict[str, RowView]:
    """Token rows (three arrays of one length per row), plus a row whose arrays differ."""
    rows: dict[str, Row] = {f"r{n}": sample_row(n, length=3 + n) for n in range(5)}
    rows["odd"] = {
        "input_ids": np.arange(4, dtype=np.int64),
        "generation_logprobs": np.zeros(2, dtype=np.float32),
        "token_mask": np.ones(4, dtype=bool),
        "reward": 0.5,
        "length": 4,
        "truncated": False,
    }
    return {key: validate_row(STAGING_PARTITION, key, row) for key, row in rows.items()}


def _read(path: Path, data: bytes, rows: int) -> dict[str, Any]:
    path.write_bytes(data)
    loaded = read_segment(
        path,
        partition=STAGING_PARTITION,
        sha256=sha256_hex(data),
        byte_size=len(data),
        row_count=rows,
    )
    return dict(loaded.rows)


def _header(data: bytes) -> dict[str, Any]:
    (length,) = struct.unpack_from("<Q", data)
    metadata = json.loads(data[8 : 8 + length])["__metadata__"]
    header: dict[str, Any] = json.loads(metadata[SEGMENT_METADATA_KEY])
    return header


def test_equal_lengths_are_written_once_and_every_row_comes_back_exactly(tmp_path: Path) -> None:
    rows = _rows()
    tokens = {key: row for key, row in rows.items() if key != "odd"}
    data, _keys = encode_segment(STAGING_PARTITION, tokens)
    header = _header(data)
    assert header["schema_version"] == 2
    (group,) = header["groups"]
    # input_ids (0) has its lengths; logprobs (1) and mask (2) read them.
    assert group["shared_lengths"] == [[1, 0], [2, 0]]
    tensors = safetensors.numpy.load(data)
    assert "0/0/lengths" in tensors and "0/1/lengths" not in tensors
    loaded = _read(tmp_path / "s.segment.safetensors", data, len(tokens))
    for key, row in tokens.items():
        assert_rows_identical(dict(loaded[key]), dict(row))
    # Version 1 wrote a lengths tensor per array field: 4 bytes per row each.
    old, _ = encode_segment(STAGING_PARTITION, tokens, version=1)
    assert len(old) - len(data) >= 2 * 4 * len(tokens)
    # A row whose logprobs are shorter (same schema, same group): only the mask shares.
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    (group,) = _header(data)["groups"]
    assert group["shared_lengths"] == [[2, 0]]
    loaded = _read(tmp_path / "t.segment.safetensors", data, len(rows))
    for key, row in rows.items():
        assert_rows_identical(dict(loaded[key]), dict(row))


def test_a_version_1_segment_is_still_read_exactly(tmp_path: Path) -> None:
    rows = _rows()
    data, _keys = encode_segment(STAGING_PARTITION, rows, version=1)
    header = _header(data)
    assert header["schema_version"] == 1
    assert all("shared_lengths" not in group for group in header["groups"])
    loaded = _read(tmp_path / "s.segment.safetensors", data, len(rows))
    for key, row in rows.items():
        assert_rows_identical(dict(loaded[key]), dict(row))


def _with_header(data: bytes, header: dict[str, Any]) -> bytes:
    """``data`` (a segment) with its header replaced, the tensors kept."""
    tensors = safetensors.numpy.load(data)
    return bytes(
        safetensors.numpy.save(tensors, metadata={SEGMENT_METADATA_KEY: json.dumps(header)})
    )


@pytest.mark.parametrize(
    ("shared", "version", "problem"),
    [
        ([[1, 0], [2, 1]], 2, "[2, 1] is not an array field reading an earlier"),
        ([[1, 2], [2, 0]], 2, "[1, 2] is not an array field reading an earlier"),
        ([[1, 0], [1, 0]], 2, "a field is listed twice"),
        ([[3, 0], [1, 0], [2, 0]], 2, "[3, 0] is not an array field"),
        ([[1, 0], [2, 0]], 1, "version 1 shares no lengths"),
    ],
)
def test_impossible_sharing_is_refused_naming_the_segment(
    tmp_path: Path, shared: list[list[int]], version: int, problem: str
) -> None:
    rows = {key: row for key, row in _rows().items() if key != "odd"}
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    header = _header(data)
    header["schema_version"] = version
    header["groups"][0]["shared_lengths"] = shared
    path = tmp_path / "s.segment.safetensors"
    with pytest.raises(DataPlaneCheckpointError) as caught:
        _read(path, _with_header(data, header), len(rows))
    assert caught.value.path == path
    assert problem in str(caught.value)


def test_an_unknown_segment_version_is_refused_naming_it(tmp_path: Path) -> None:
    rows = _rows()
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    header = _header(data)
    header["schema_version"] = 3
    path = tmp_path / "s.segment.safetensors"
    with pytest.raises(DataPlaneCheckpointError) as caught:
        _read(path, _with_header(data, header), len(rows))
    assert caught.value.path == path
    assert "unsupported segment schema_version 3 (this build reads 1, 2)" in str(caught.value)


def test_each_key_keeps_only_what_follows_the_prefix_it_shares_with_the_key_before(
    tmp_path: Path,
) -> None:
    group = "189bc5c6f98a46249273c65cf967c560"
    rows = {
        key: validate_row(STAGING_PARTITION, key, sample_row(n))
        for n, key in enumerate([*(f"{group}_g{i}" for i in range(12)), "ключ", "ключи", "z"])
    }
    data, keys = encode_segment(STAGING_PARTITION, rows)
    tensors = safetensors.numpy.load(data)
    shared = tensors["0/key_shared"].tolist()
    assert keys == tuple(sorted(rows))
    assert shared[0] == 0 and shared[1] == len(group) + 2  # "<group>_g0" then "<group>_g1"
    assert shared[keys.index("ключи")] == len("ключ")
    assert tensors["0/keys"].tobytes().count(group.encode()) == 1
    loaded = _read(tmp_path / "s.segment.safetensors", data, len(rows))
    assert list(loaded) == list(keys)
    for key, row in rows.items():
        assert_rows_identical(dict(loaded[key]), dict(row))
    old, _ = encode_segment(STAGING_PARTITION, rows, version=1)
    assert len(old) - len(data) > 10 * len(group)


def test_a_key_sharing_more_than_the_key_before_holds_is_refused(tmp_path: Path) -> None:
    rows = {key: validate_row(STAGING_PARTITION, key, sample_row(1)) for key in ("a", "b")}
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    tensors = safetensors.numpy.load(data)
    tensors["0/key_shared"] = np.array([0, 2], dtype=np.uint8)
    metadata = {SEGMENT_METADATA_KEY: json.dumps(_header(data))}
    path = tmp_path / "s.segment.safetensors"
    with pytest.raises(DataPlaneCheckpointError) as caught:
        _read(path, bytes(safetensors.numpy.save(tensors, metadata=metadata)), 2)
    assert caught.value.path == path
    assert "tensor '0/key_shared'[1]: 2 characters of a key of 1" in str(caught.value)


@pytest.mark.parametrize("field", [0, 1, 2])
def test_an_array_field_longer_or_shorter_than_the_lengths_it_reads_is_refused(
    tmp_path: Path, field: int
) -> None:
    """The lengths are checked once, with the field that owns them; each field sharing
    them is still checked against their sum."""
    rows = {key: row for key, row in _rows().items() if key != "odd"}
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    assert _header(data)["groups"][0]["shared_lengths"] == [[1, 0], [2, 0]]
    tensors = safetensors.numpy.load(data)
    tensors[f"0/{field}/data"] = tensors[f"0/{field}/data"][:-1]
    metadata = {SEGMENT_METADATA_KEY: json.dumps(_header(data))}
    path = tmp_path / "s.segment.safetensors"
    with pytest.raises(DataPlaneCheckpointError) as caught:
        _read(path, bytes(safetensors.numpy.save(tensors, metadata=metadata)), len(rows))
    assert caught.value.path == path
    assert f"tensor '0/{field}/data': its lengths do not add up" in str(caught.value)
