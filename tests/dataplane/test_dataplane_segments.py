"""Incremental checkpoints in segments, for every store: exact round trip, only new rows
written, unchanged rows referenced, and damage to a segment refused by its name."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import dataplane_stores
import numpy as np
import pytest
from dataplane_helpers import Plane, PlaneFactory, assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    METADATA_FILENAME,
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneCheckpointError,
    Row,
)
from rollvault.dataplane.checkpoint_format import decode_envelope, encode_envelope
from rollvault.dataplane.rows import validate_row
from rollvault.dataplane.segmented import (
    SegmentedWriter,
    checkpoint_summary,
    read_any_checkpoint,
    read_segmented,
    referenced_segments,
    row_bytes,
)
from rollvault.dataplane.segments import (
    SegmentRows,
    WrittenSegment,
    read_segment,
    segment_files,
    write_segment,
)

make_plane = dataplane_stores.make_plane  # the fixture: every test runs on every store
USER: dict[str, Any] = {"sidecars": {}, "note": "ünï"}


def mixed_rows() -> dict[str, Row]:
    """Rows of several schemas: a scalar-only row, zero-length arrays, other dtypes."""
    return {
        "a_g0": sample_row(1),
        "a_g1": sample_row(2, length=0),
        "b/0": {"only": 3, "neg": -(2**63), "f": -0.0, "ok": True},
        "b/1": {"input_ids": np.arange(4, dtype=np.int32), "u": np.array([2**64 - 1], np.uint64)},
        "ключ": sample_row(5, length=3),
    }


async def written(
    writer: SegmentedWriter, plane: Plane, directory: Path, stem: str, *, commit: bool = True
) -> Any:
    pending = await asyncio.to_thread(writer.write, directory, plane.capture(), USER, stem=stem)
    if commit:
        writer.committed(pending)
    return pending.info


def assert_holds(directory: Path, segments: Path, expected: dict[str, dict[str, Row]]) -> None:
    loaded = read_segmented(directory, segments).checkpoint
    assert loaded.user_metadata == USER
    assert sorted(loaded.partitions) == sorted(expected)
    for partition, rows in expected.items():
        assert sorted(loaded.partitions[partition]) == sorted(rows)
        for key, row in rows.items():
            assert_rows_identical(dict(loaded.partitions[partition][key]), row)


def read_written(directory: Path, segment: WrittenSegment) -> SegmentRows:
    """Every row of ``segment`` (a staging segment in ``directory``), verified."""
    return read_segment(
        directory / segment.file,
        partition=STAGING_PARTITION,
        sha256=segment.sha256,
        byte_size=segment.byte_size,
        row_count=segment.row_count,
    )


def test_a_segment_round_trips_every_schema_exactly(tmp_path: Path) -> None:
    rows = {key: validate_row(STAGING_PARTITION, key, row) for key, row in mixed_rows().items()}
    segment = write_segment(tmp_path, "1-s.segment.safetensors", STAGING_PARTITION, rows)
    assert sorted(segment.keys) == sorted(rows)
    # The safetensors header of 4 schemas (~80 bytes per tensor); no JSON per row.
    assert segment.byte_size - sum(row_bytes(key, row) for key, row in rows.items()) < 3_000
    loaded = read_written(tmp_path, segment)
    assert loaded.keys == segment.keys
    for key, row in mixed_rows().items():
        assert list(loaded.rows[key]) == list(row)  # field order kept
        assert_rows_identical(dict(loaded.rows[key]), row)
    arrays = [v for row in loaded.rows.values() for v in row.values() if isinstance(v, np.ndarray)]
    # Rows are read-only views of their column (a copy per row cost more than the load).
    assert arrays and not any(array.flags.writeable for array in arrays)
    # Only the wanted rows are handed out, the others are not even sliced.
    wanted = [ordinal % 2 == 0 for ordinal in range(segment.row_count)]
    some = read_segment(
        tmp_path / segment.file,
        partition=STAGING_PARTITION,
        sha256=segment.sha256,
        byte_size=segment.byte_size,
        row_count=segment.row_count,
        wanted=wanted,
    )
    assert some.keys == segment.keys
    assert list(some.rows) == [key for key, kept in zip(segment.keys, wanted, strict=True) if kept]
    for key in some.rows:
        assert_rows_identical(dict(some.rows[key]), mixed_rows()[key])
    # The orphan of a failed try at the same snapshot sequence number is replaced.
    fewer = {key: rows[key] for key in list(rows)[:2]}
    again = write_segment(tmp_path, segment.file, STAGING_PARTITION, fewer)
    assert (tmp_path / segment.file).stat().st_size == again.byte_size < segment.byte_size


def test_only_rows_new_since_the_committed_checkpoint_are_written(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    segments = tmp_path / "segments"

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        await plane.put(STAGING_PARTITION, mixed_rows())
        await plane.put(TRAIN_PARTITION, {"t_g0": sample_row(9)})
        first = await written(writer, plane, tmp_path / "s1", "000001")
        assert first.new_rows == 6
        assert first.row_counts == {STAGING_PARTITION: 5, TRAIN_PARTITION: 1}
        # Nothing changed: nothing but the index is written.
        second = await written(writer, plane, tmp_path / "s2", "000002")
        assert (second.new_rows, second.segment_bytes) == (0, 0)
        assert second.bytes_written == (tmp_path / "s2" / METADATA_FILENAME).stat().st_size
        # One row cleared, one new, one cleared and put again with other content.
        await plane.clear(STAGING_PARTITION, ["a_g0", "b/0"])
        await plane.put(STAGING_PARTITION, {"c/0": sample_row(11), "b/0": {"only": 4}})
        third = await written(writer, plane, tmp_path / "s3", "000003")
        assert third.new_rows == 2
        assert third.new_row_bytes == row_bytes("c/0", sample_row(11)) + row_bytes(
            "b/0", {"only": 4}
        )
        assert third.segment_bytes < 1.1 * third.new_row_bytes + 2_000
        assert set(third.referenced) == {
            "000001-rollout_staging.segment.safetensors",
            "000001-train.segment.safetensors",
            "000003-rollout_staging.segment.safetensors",
        }
        expected = {STAGING_PARTITION: mixed_rows(), TRAIN_PARTITION: {"t_g0": sample_row(9)}}
        assert_holds(tmp_path / "s1", segments, expected)
        del expected[STAGING_PARTITION]["a_g0"]
        expected[STAGING_PARTITION].update({"c/0": sample_row(11), "b/0": {"only": 4}})
        assert_holds(tmp_path / "s3", segments, expected)
        summary = checkpoint_summary(tmp_path / "s3", segments)
        assert summary.row_counts == {STAGING_PARTITION: 5, TRAIN_PARTITION: 1}
        assert {path.name for path, _size in summary.files} == set(third.referenced)

    asyncio.run(main())


def test_an_uncommitted_checkpoint_is_written_again_by_the_next(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    segments = tmp_path / "segments"

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        await plane.put(TRAIN_PARTITION, {"t_g0": sample_row(1)})
        await written(writer, plane, tmp_path / "s1", "000001")
        await plane.put(TRAIN_PARTITION, {"t_g1": sample_row(2)})
        lost = await written(writer, plane, tmp_path / "s2", "000002", commit=False)
        again = await written(writer, plane, tmp_path / "s3", "000003")
        assert lost.new_rows == again.new_rows == 1
        assert "000002-train.segment.safetensors" not in again.referenced
        assert referenced_segments([tmp_path / "s1", tmp_path / "s3"]) == set(again.referenced)
        assert "000002-train.segment.safetensors" in segment_files(segments)

    asyncio.run(main())


def test_a_writer_seeded_from_a_loaded_checkpoint_writes_nothing_old(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    segments = tmp_path / "segments"

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await plane.put(STAGING_PARTITION, mixed_rows())
        await written(SegmentedWriter(segments), plane, tmp_path / "s1", "000001")
        loaded = read_any_checkpoint(tmp_path / "s1", segments)
        restored = make_plane(DataPlaneMutationCut())
        await restored.load_verified(loaded.checkpoint, source=tmp_path / "s1")
        writer = SegmentedWriter(segments)
        writer.seed(restored.capture(), loaded)
        await restored.put(STAGING_PARTITION, {"new/0": sample_row(3)})
        info = await written(writer, restored, tmp_path / "s2", "000002")
        assert info.new_rows == 1
        assert_holds(
            tmp_path / "s2", segments, {STAGING_PARTITION: {**mixed_rows(), "new/0": sample_row(3)}}
        )

    asyncio.run(main())


@pytest.fixture
def two_snapshots(tmp_path: Path) -> tuple[Path, Path]:
    """Two checkpoints of the embedded store sharing one segment; returns (segments, second)."""
    from rollvault.dataplane import EmbeddedDataPlane

    segments = tmp_path / "segments"

    async def main() -> None:
        plane = EmbeddedDataPlane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        await plane.put(STAGING_PARTITION, mixed_rows())
        await written(writer, plane, tmp_path / "s1", "000001")
        await plane.put(TRAIN_PARTITION, {"t_g0": sample_row(9)})
        await written(writer, plane, tmp_path / "s2", "000002")

    asyncio.run(main())
    return segments, tmp_path / "s2"


def refused(directory: Path, segments: Path, culprit: Path, message: str) -> None:
    with pytest.raises(DataPlaneCheckpointError, match=message) as caught:
        read_segmented(directory, segments)
    assert caught.value.path == culprit


def test_a_missing_segment_is_named(two_snapshots: tuple[Path, Path]) -> None:
    segments, snapshot = two_snapshots
    shared = segments / "000001-rollout_staging.segment.safetensors"
    shared.unlink()
    refused(snapshot, segments, shared, "missing segment")


@pytest.mark.parametrize("damage", ["flip", "truncate", "append"])
def test_a_damaged_segment_is_named(two_snapshots: tuple[Path, Path], damage: str) -> None:
    segments, snapshot = two_snapshots
    shared = segments / "000001-rollout_staging.segment.safetensors"
    data = bytearray(shared.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        del data[-3:]
    else:
        data += b"\0"
    shared.write_bytes(bytes(data))
    refused(snapshot, segments, shared, "checksum mismatch" if damage == "flip" else "size is")


def rewrite_index(snapshot: Path, change: Any) -> Path:
    path = snapshot / METADATA_FILENAME
    version, content_bytes = decode_envelope(path.read_bytes(), path)
    content = json.loads(content_bytes)
    change(content)
    path.write_bytes(encode_envelope(json.dumps(content).encode(), version))
    return path


def test_a_bitmap_that_disagrees_with_its_count_is_refused(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots

    def drop_a_row(content: dict[str, Any]) -> None:
        reference = content["segments"][0]
        bits = bytearray(base64.b64decode(reference["live"]))
        bits[0] &= 0xFE
        reference["live"] = base64.b64encode(bytes(bits)).decode()

    path = rewrite_index(snapshot, drop_a_row)
    refused(snapshot, segments, path, r"segments\[0\]\.live: 4 rows set, live_rows records 5")


def test_a_segment_file_name_cannot_leave_the_segments_directory(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots
    path = rewrite_index(
        snapshot, lambda c: c["segments"][0].update(file="../x.segment.safetensors")
    )
    refused(snapshot, segments, path, "segments\\[0\\].file")


def test_a_segment_listed_under_another_partition_is_refused(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots
    path = rewrite_index(snapshot, lambda c: c["segments"][0].update(partition=TRAIN_PARTITION))
    refused(
        snapshot,
        segments,
        segments / "000001-rollout_staging.segment.safetensors",
        "segment holds partition 'rollout_staging', the snapshot says 'train'",
    )
    del path


def test_a_segment_holding_a_key_twice_is_refused_naming_it(tmp_path: Path) -> None:
    rows = {key: validate_row(STAGING_PARTITION, key, sample_row(1)) for key in ("dup-x", "dup-y")}
    segment = write_segment(tmp_path, "1-s.segment.safetensors", STAGING_PARTITION, rows)
    path = tmp_path / segment.file
    data = path.read_bytes()
    # The one group's keys, concatenated; the second after the 4 characters it shares with
    # the first (version 2).
    assert data.count(b"dup-xy") == 1
    path.write_bytes(data.replace(b"dup-xy", b"dup-xx"))
    with pytest.raises(DataPlaneCheckpointError, match="segment holds key 'dup-x' twice"):
        read_segment(
            path,
            partition=STAGING_PARTITION,
            sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
            byte_size=segment.byte_size,
            row_count=segment.row_count,
        )


def test_rows_that_differ_only_in_a_dtype_or_a_scalar_kind_get_schemas_of_their_own(
    tmp_path: Path,
) -> None:
    # A row's schema is looked up by its field names and value types, then its arrays'
    # dtypes: same names and types with another dtype, or a bool where an int was, is
    # another schema, never the first one's (its values would be cast).
    raw: dict[str, Row] = {
        "k0": {"ids": np.arange(3, dtype=np.int64), "n": 1},
        "k1": {"ids": np.arange(3, dtype=np.int32), "n": 2},
        "k2": {"ids": np.arange(2, dtype=np.int64), "n": True},
        "k3": {"ids": np.arange(4, dtype=np.int64), "n": 3},
        "k4": {"n": 1.5, "ids": np.arange(1, dtype=np.int64)},
    }
    rows = {key: validate_row(STAGING_PARTITION, key, row) for key, row in raw.items()}
    segment = write_segment(tmp_path, "1-s.segment.safetensors", STAGING_PARTITION, rows)
    loaded = read_written(tmp_path, segment)
    assert [group.rows for group in loaded.header.groups] == [2, 1, 1, 1]
    assert loaded.keys == ("k0", "k3", "k1", "k2", "k4")
    for key, row in raw.items():
        assert list(loaded.rows[key]) == list(row)
        assert_rows_identical(dict(loaded.rows[key]), row)
        assert type(loaded.rows[key]["n"]) is type(row["n"])
