"""A segment's rows are built when first read (issue 16: a restore uses only their keys):
decoding builds none, a row read is the row that was written, read-only, built once and
kept, and behaves as the read-only mapping rows are everywhere else."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataplane_helpers import assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    STAGING_PARTITION,
    DataPlaneConflictError,
    EmbeddedDataPlane,
    Row,
)
from rollvault.dataplane.rows import RowView, validate_row
from rollvault.dataplane.segment_rows import RowColumns, SegmentRow
from rollvault.dataplane.segmented import read_segmented
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.dataplane.segments import decode_segment, encode_segment

PATH = Path("segments/000001-rollout_staging.segment.safetensors")


def _rows() -> dict[str, RowView]:
    """Token rows of several lengths (one empty), and a row of scalars only."""
    rows: dict[str, Row] = {f"r{n}": sample_row(n, length=n) for n in range(5)}
    rows["s"] = {"only": 3, "f": -0.0, "ok": True}
    return {key: validate_row(STAGING_PARTITION, key, row) for key, row in rows.items()}


def _decoded(rows: dict[str, RowView], wanted: list[bool] | None = None) -> dict[str, RowView]:
    data, _keys = encode_segment(STAGING_PARTITION, rows)
    return decode_segment(
        PATH, data, partition=STAGING_PARTITION, row_count=len(rows), wanted=wanted
    ).rows


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows are built (one entry each) from here on."""
    built: list[int] = []
    build = RowColumns.row

    def counted(self: RowColumns, ordinal: int) -> dict[str, Any]:
        built.append(ordinal)
        return build(self, ordinal)

    monkeypatch.setattr(RowColumns, "row", counted)
    return built


def test_decoding_builds_no_row_and_reading_one_builds_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _count_builds(monkeypatch)
    rows = _decoded(_rows())
    assert sorted(rows) == sorted(_rows()) and built == []
    row = rows["r3"]
    first = row["input_ids"]
    assert row["input_ids"] is first and dict(row)["input_ids"] is first  # kept, not rebuilt
    assert len(built) == 1


def test_a_row_read_is_the_row_written_read_only_and_of_its_fields_order() -> None:
    written = _rows()
    for key, row in _decoded(written).items():
        assert isinstance(row, SegmentRow) and isinstance(row, Mapping)
        assert_rows_identical(dict(row), dict(written[key]))
        assert list(row) == list(written[key]) == list(row.keys())
        assert len(row) == len(written[key])
        assert [value for _field, value in row.items()] == list(row.values())
        for value in row.values():
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable
    scalars = _decoded(written)["s"]
    assert (type(scalars["only"]), type(scalars["f"]), type(scalars["ok"])) == (int, float, bool)
    negative_zero = scalars["f"]
    assert isinstance(negative_zero, float) and negative_zero.hex() == (-0.0).hex()


def test_a_row_compares_hashes_and_misses_as_a_read_only_mapping() -> None:
    written = _rows()
    decoded = _decoded(written)
    row = decoded["s"]
    assert row == written["s"] and written["s"] == row  # the MappingProxyType row, both ways
    assert row == {"only": 3, "f": -0.0, "ok": True} and row != {"only": 3}
    assert row == _decoded(written)["s"]  # another decode of the same bytes
    assert row != ["only", "f", "ok"]
    assert "only" in row and "missing" not in row
    assert row.get("missing") is None and row.get("only") == 3
    with pytest.raises(KeyError):
        row["missing"]
    with pytest.raises(TypeError, match="unhashable"):
        hash(row)
    assert "'only': 3" in repr(row)
    assert not hasattr(row, "__setitem__") and not hasattr(row, "__dict__")


def test_rows_left_out_are_not_held_and_each_kept_row_is_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = _rows()
    ordered = sorted(written)  # one schema per group, rows by key: r0..r4 then s
    wanted = [key in {"r1", "r4", "s"} for key in ordered]
    built = _count_builds(monkeypatch)
    decoded = _decoded(written, wanted)
    assert sorted(decoded) == ["r1", "r4", "s"] and built == []
    for key, row in decoded.items():
        assert_rows_identical(dict(row), dict(written[key]))


def test_a_loaded_row_put_again_is_a_no_op_and_a_changed_one_conflicts(tmp_path: Path) -> None:
    """A store that loaded its rows from segments compares a put with them as with any row."""

    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        source = EmbeddedDataPlane(cut)
        rows = {key: dict(row) for key, row in _rows().items()}
        await source.put(STAGING_PARTITION, rows)
        writer = SegmentedWriter(tmp_path / "segments")
        pending = writer.write(tmp_path / "dp", source.capture(), {}, stem="000001")
        writer.committed(pending)
        loaded = read_segmented(tmp_path / "dp", tmp_path / "segments").checkpoint
        plane = EmbeddedDataPlane(cut)
        await plane.load_verified(loaded, source=tmp_path / "dp")
        await plane.put(STAGING_PARTITION, {"r2": rows["r2"]})
        changed = dict(rows["r2"], reward=9.0)
        with pytest.raises(DataPlaneConflictError, match="'reward': 0.5 stored, 9.0 new"):
            await plane.put(STAGING_PARTITION, {"r2": changed})
        got = await plane.get(STAGING_PARTITION, ["r2", "s"])
        assert_rows_identical(got["r2"], rows["r2"])
        assert got["s"] == rows["s"] and type(got["s"]) is dict

    asyncio.run(scenario())
