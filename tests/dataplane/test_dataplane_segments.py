"""Incremental checkpoints in segments, for every store: exact round trip, only new rows
written, unchanged rows referenced, and damage to a segment refused by its name."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import dataplane_stores
import numpy as np
import pytest
from data_plane_v2 import index_as_version_2, index_as_version_3, index_as_version_4
from dataplane_helpers import Plane, PlaneFactory, assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    METADATA_FILENAME,
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneCheckpointError,
    Row,
)
from rollvault.dataplane.checkpoint_format import (
    decode_envelope,
    encode_envelope,
)
from rollvault.dataplane.rows import validate_row
from rollvault.dataplane.segmented import open_any_checkpoint, read_any_checkpoint, read_segmented
from rollvault.dataplane.segmented_index import (
    checkpoint_summary,
    read_segmented_content,
    referenced_segments,
)
from rollvault.dataplane.segmented_writer import SegmentedWriter, row_bytes
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
    read_some = functools.partial(
        read_segment,
        tmp_path / segment.file,
        partition=STAGING_PARTITION,
        sha256=segment.sha256,
        byte_size=segment.byte_size,
        row_count=segment.row_count,
    )
    some = read_some(wanted=wanted)
    assert some.keys == segment.keys
    assert list(some.rows) == [key for key, kept in zip(segment.keys, wanted, strict=True) if kept]
    for key in some.rows:
        assert_rows_identical(dict(some.rows[key]), mixed_rows()[key])
    # A keep list of another length than the segment's rows is refused, not cut short.
    for wrong in (wanted[:-1], [*wanted, True]):
        with pytest.raises(DataPlaneCheckpointError, match=f"which of {len(wrong)} rows it holds"):
            read_some(wanted=wrong)
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
        # The files: the held segments and the catalogs describing them (version 4).
        assert third.catalogs == ("000001-rows.catalog.json", "000003-rows.catalog.json")
        assert {path.name for path, _size in summary.files} == {
            *third.referenced,
            *third.catalogs,
        }

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
        # Retention keeps the held segments and the catalogs describing them, not the lost
        # try's catalog.
        files = referenced_segments([tmp_path / "s1", tmp_path / "s3"])
        assert files == {*again.referenced, *again.catalogs}
        assert "000002-rows.catalog.json" not in files
        assert (segments / "000002-rows.catalog.json").exists()
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
    index_as_version_2(snapshot)

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
    index_as_version_2(snapshot)
    path = rewrite_index(
        snapshot, lambda c: c["segments"][0].update(file="../x.segment.safetensors")
    )
    refused(snapshot, segments, path, "segments\\[0\\].file")


def test_a_segment_listed_under_another_partition_is_refused(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots
    index_as_version_2(snapshot)
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


# -- version 3: the compact index -------------------------------------------------------


def index_content(snapshot: Path) -> tuple[int, Any]:
    path = snapshot / METADATA_FILENAME
    version, content_bytes = decode_envelope(path.read_bytes(), path)
    return version, json.loads(content_bytes)


def test_a_version_3_index_as_main_wrote_it_is_one_short_array_per_segment(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots
    index_as_version_3(snapshot)
    version, content = index_content(snapshot)
    assert version == 3
    staging = content["partitions"].index(STAGING_PARTITION)
    train = content["partitions"].index(TRAIN_PARTITION)
    shared = segments / "000001-rollout_staging.segment.safetensors"
    digest = hashlib.sha256(shared.read_bytes()).digest()
    # [name, partition, sha256, byte_size, row_count, live]: the file name as the sequence
    # number it derives from, the partition as an index, the raw digest, every row held.
    assert content["segments"][0] == [
        1,
        staging,
        base64.b64encode(digest).decode(),
        shared.stat().st_size,
        5,
        [],
    ]
    assert content["segments"][1][:2] == [2, train]
    for entry in content["segments"]:
        assert len(json.dumps(entry, separators=(",", ":"))) < 80  # version 2: ~250
    index = read_segmented_content(snapshot)
    assert [(held.file, held.partition, held.live_rows) for held in index.segments] == [
        ("000001-rollout_staging.segment.safetensors", STAGING_PARTITION, 5),
        ("000002-train.segment.safetensors", TRAIN_PARTITION, 1),
    ]
    assert index.segments[0].sha256 == digest.hex()


def test_a_version_2_index_is_still_read_to_the_same_rows(
    two_snapshots: tuple[Path, Path], make_plane: PlaneFactory
) -> None:
    segments, snapshot = two_snapshots
    expected = {STAGING_PARTITION: mixed_rows(), TRAIN_PARTITION: {"t_g0": sample_row(9)}}
    summary = checkpoint_summary(snapshot, segments)
    referenced = referenced_segments([snapshot])
    index_as_version_2(snapshot)
    assert index_content(snapshot)[0] == 2
    assert_holds(snapshot, segments, expected)
    again = checkpoint_summary(snapshot, segments)
    # The same segments, without version 4's catalogs.
    assert (again.schema_version, again.row_counts, again.files) == (
        2,
        summary.row_counts,
        tuple(entry for entry in summary.files if entry[0].name.endswith(".safetensors")),
    )
    assert referenced_segments([snapshot]) == {
        file for file in referenced if file.endswith(".safetensors")
    }

    async def main() -> None:
        # A writer seeded from the version 2 checkpoint writes no old row, version 5: one
        # catalog describing every held segment.
        loaded = read_any_checkpoint(snapshot, segments)
        restored = make_plane(DataPlaneMutationCut())
        await restored.load_verified(loaded.checkpoint, source=snapshot)
        writer = SegmentedWriter(segments)
        writer.seed(restored.capture(), loaded)
        info = await written(writer, restored, snapshot.parent / "s3", "000003")
        assert info.new_rows == 0
        assert index_content(snapshot.parent / "s3")[0] == 5
        assert info.catalogs == ("000003-rows.catalog.json",)
        index = read_segmented_content(snapshot.parent / "s3", segments)
        assert index.catalogs[0].segments == info.referenced
        assert_holds(snapshot.parent / "s3", segments, expected)

    asyncio.run(main())


def test_an_unknown_index_version_is_refused_naming_the_file(
    two_snapshots: tuple[Path, Path],
) -> None:
    segments, snapshot = two_snapshots
    path = snapshot / METADATA_FILENAME
    _version, content_bytes = decode_envelope(path.read_bytes(), path)
    path.write_bytes(encode_envelope(content_bytes, 6))
    refused(snapshot, segments, path, "unsupported schema_version 6")
    with pytest.raises(DataPlaneCheckpointError, match="unsupported schema_version 6"):
        checkpoint_summary(snapshot, segments)


def test_held_rows_are_runs_or_a_bitmap_whichever_is_shorter(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    segments = tmp_path / "segments"

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        rows = {f"r{index:03d}": sample_row(index) for index in range(100)}
        await plane.put(STAGING_PARTITION, rows)
        await written(writer, plane, tmp_path / "s1", "000001")
        # A contiguous block cleared: three runs (held, dropped, held).
        block = [f"r{index:03d}" for index in range(10, 40)]
        await plane.clear(STAGING_PARTITION, block)
        await written(writer, plane, tmp_path / "s2", "000002")
        (entry,) = index_content(tmp_path / "s2")[1]["segments"]
        assert entry[2] == [10, 30, 60]
        # Every third row cleared: the 13-byte bitmap is shorter than ~40 runs.
        scattered = [f"r{index:03d}" for index in range(40, 100, 3)]
        await plane.clear(STAGING_PARTITION, scattered)
        await written(writer, plane, tmp_path / "s3", "000003")
        (entry,) = index_content(tmp_path / "s3")[1]["segments"]
        assert isinstance(entry[2], str) and len(base64.b64decode(entry[2])) == 13
        # The first row cleared: the runs start with an empty held run.
        await plane.clear(STAGING_PARTITION, ["r000"])
        await written(writer, plane, tmp_path / "s4", "000004")
        for name in ("s2", "s3", "s4"):
            index = read_segmented_content(tmp_path / name, segments)
            (held,) = index.segments
            kept = {key for key, _row in plane_rows(tmp_path / name, segments)}
            assert held.live_rows == len(kept)
        gone = {"r000", *block, *scattered}
        assert_holds(
            tmp_path / "s4",
            segments,
            {STAGING_PARTITION: {k: row for k, row in rows.items() if k not in gone}},
        )
        (entry,) = index_content(tmp_path / "s4")[1]["segments"]
        assert isinstance(entry[2], str) or entry[2][:2] == [0, 1]

    asyncio.run(main())


def plane_rows(directory: Path, segments: Path) -> list[tuple[str, Any]]:
    loaded = read_segmented(directory, segments).checkpoint
    return [(key, row) for rows in loaded.partitions.values() for key, row in rows.items()]


def test_a_segment_name_off_the_pattern_is_kept_as_text(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    segments = tmp_path / "segments"

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await plane.put(STAGING_PARTITION, mixed_rows())
        # "7" is not the zero-padded form "000007": the name cannot be derived from 7.
        await written(SegmentedWriter(segments), plane, tmp_path / "s1", "7")
        (entry,) = index_content(tmp_path / "s1")[1]["segments"]
        assert entry[0] == "7-rollout_staging.segment.safetensors"
        assert_holds(tmp_path / "s1", segments, {STAGING_PARTITION: mixed_rows()})

    asyncio.run(main())


def _set(position: int, value: Any, segment: int = 0) -> Any:
    def change(content: dict[str, Any]) -> None:
        content["segments"][segment][position] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set(1, 7), r"segments\[0\]\[1\] \(partition\): 7 is not an index of"),
        (_set(1, -1), r"Expected `int` >= 0 - at `\$.content.segments\[0\]\[1\]`"),
        (_set(2, "AAAA"), r"Expected `bytes` of length >= 32 - at `\$.content.segments\[0\]\[2\]`"),
        (_set(0, "../x.segment.safetensors"), r"at `\$.content.segments\[0\]\[0\]`"),
        (_set(0, 1.5), r"at `\$.content.segments\[0\]\[0\]`"),
        (
            _set(5, [2, 3, 1]),
            r"segments\[0\]\[5\] \(live\): runs add up to 6 rows, the segment has 5",
        ),
        (_set(5, [2, 2]), r"segments\[0\]\[5\] \(live\): runs add up to 4 rows, the segment has 5"),
        (_set(5, [2, 0, 3]), r"segments\[0\]\[5\] \(live\): run 1 is empty"),
        (_set(5, [5]), r"segments\[0\]\[5\] \(live\): one run holds every row"),
        (_set(5, "AAA="), r"segments\[0\]\[5\] \(live\): 2 bytes for 5 rows \(expected 1\)"),
        (_set(5, "IA=="), r"segments\[0\]\[5\] \(live\): bits set beyond row 5"),
        (_set(5, None), r"at `\$.content.segments\[0\]\[5\]`"),
        # msgspec 0.23 names the enclosing object, not the entry, for an array too long.
        (lambda c: c["segments"][0].append(1), r"Expected `array` of at most length 6 - at `\$"),
        (
            lambda c: c["segments"][0].pop(),
            r"at least length 6, got 5 - at `\$.content.segments\[0\]`",
        ),
        (
            lambda c: c["segments"].append(list(c["segments"][0])),
            r"segments\[2\]\[0\] \(name\): '000001-rollout_staging.segment.safetensors' "
            r"listed twice \(first at segments\[0\]\)",
        ),
        (
            _set(0, "000001-rollout_staging.segment.safetensors", segment=1),
            r"segments\[1\]\[0\] \(name\): .* listed twice",
        ),
        (lambda c: c.update(extra=1), r"Object contains unknown field `extra` - at `\$.content`"),
    ],
)
def test_a_malformed_version_3_entry_is_refused_naming_the_file_and_field(
    two_snapshots: tuple[Path, Path], change: Any, message: str
) -> None:
    segments, snapshot = two_snapshots
    index_as_version_3(snapshot)
    path = rewrite_index(snapshot, change)
    refused(snapshot, segments, path, message)
    with pytest.raises(DataPlaneCheckpointError, match=message):
        checkpoint_summary(snapshot, segments)


def test_opening_reads_the_index_and_finishing_verifies_the_segments(
    two_snapshots: tuple[Path, Path],
) -> None:
    """open_any_checkpoint gives the user metadata before any segment is verified (their
    SHA-256s are computed in a worker thread); finish() refuses a damaged one by name."""
    segments, snapshot = two_snapshots
    shared = segments / "000001-rollout_staging.segment.safetensors"
    data = bytearray(shared.read_bytes())
    data[-1] ^= 0x01
    shared.write_bytes(bytes(data))
    opened = open_any_checkpoint(snapshot, segments)
    assert opened.user_metadata == USER
    with pytest.raises(DataPlaneCheckpointError, match="checksum mismatch") as caught:
        opened.finish()
    assert caught.value.path == shared


def test_the_first_damaged_segment_in_the_index_s_order_is_named(
    two_snapshots: tuple[Path, Path],
) -> None:
    """Every segment is read before any is verified: a later missing one must not hide
    an earlier damaged one, whose problem a read in order meets first."""
    segments, snapshot = two_snapshots
    first = segments / "000001-rollout_staging.segment.safetensors"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0x01
    first.write_bytes(bytes(data))
    (segments / "000002-train.segment.safetensors").unlink()
    refused(snapshot, segments, first, "checksum mismatch")
    first.unlink()
    refused(snapshot, segments, first, "missing segment")


def test_a_row_two_segments_hold_is_refused_naming_the_earlier_one(tmp_path: Path) -> None:
    """A key held from two segments of a partition names the later one and, in the
    message, the earlier one (searched for the message: a restore builds no row
    locations)."""
    from rollvault.dataplane import EmbeddedDataPlane

    segments = tmp_path / "segments"

    async def main() -> None:
        plane = EmbeddedDataPlane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        await plane.put(TRAIN_PARTITION, {"t_g0": sample_row(9)})
        await written(writer, plane, tmp_path / "s1", "000001")
        await plane.put(STAGING_PARTITION, mixed_rows())
        await written(writer, plane, tmp_path / "s2", "000002")
        await plane.clear(STAGING_PARTITION, {"a_g0"})
        await plane.put(STAGING_PARTITION, {"a_g0": sample_row(7)})  # a new version of it
        await written(writer, plane, tmp_path / "s3", "000003")

    asyncio.run(main())
    snapshot = tmp_path / "s3"
    index_as_version_4(snapshot, segments)  # one entry per segment, the all-held ones too
    files = [entry[0] for entry in index_content(snapshot)[1]["segments"]]
    assert files == [1, 2, 3]  # the train segment, the staging one with a hole, the new row

    def hold_every_row(content: dict[str, Any]) -> None:
        content["segments"][1][2] = []

    rewrite_index(snapshot, hold_every_row)
    refused(
        snapshot,
        segments,
        segments / "000003-rollout_staging.segment.safetensors",
        r"key 'a_g0' of partition 'rollout_staging' is also held from segment "
        r"'000002-rollout_staging.segment.safetensors'",
    )


def test_row_locations_are_each_held_row_s_segment_and_ordinal(tmp_path: Path) -> None:
    """The locations a writer is seeded with skip the rows a segment holds no more."""
    from rollvault.dataplane import EmbeddedDataPlane

    segments = tmp_path / "segments"

    async def main() -> None:
        plane = EmbeddedDataPlane(DataPlaneMutationCut())
        writer = SegmentedWriter(segments)
        await plane.put(STAGING_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        await written(writer, plane, tmp_path / "s1", "000001")
        await plane.clear(STAGING_PARTITION, {"a"})
        await plane.put(STAGING_PARTITION, {"a": sample_row(3)})
        await plane.put(TRAIN_PARTITION, {"t": sample_row(4)})
        await written(writer, plane, tmp_path / "s2", "000002")

    asyncio.run(main())
    loaded = read_segmented(tmp_path / "s2", segments)
    first, staged, train = (
        "000001-rollout_staging.segment.safetensors",
        "000002-rollout_staging.segment.safetensors",
        "000002-train.segment.safetensors",
    )
    assert loaded.locations == {
        STAGING_PARTITION: {"b": (first, 1), "a": (staged, 0)},
        TRAIN_PARTITION: {"t": (train, 0)},
    }


def test_a_version_1_checkpoint_opens_whole(tmp_path: Path) -> None:
    """A checkpoint without segments is read when opened, its metadata.json read once."""
    from rollvault.dataplane import EmbeddedDataPlane
    from rollvault.dataplane.checkpoint_io import write_checkpoint

    async def main() -> None:
        plane = EmbeddedDataPlane(DataPlaneMutationCut())
        await plane.put(STAGING_PARTITION, mixed_rows())
        write_checkpoint(tmp_path / "v1", plane.capture(), USER)

    asyncio.run(main())
    opened = open_any_checkpoint(tmp_path / "v1", tmp_path / "segments")
    assert opened.user_metadata == USER
    loaded = opened.finish()
    assert loaded.segments == {} and loaded.locations == {}
    for key, row in mixed_rows().items():
        assert_rows_identical(dict(loaded.checkpoint.partitions[STAGING_PARTITION][key]), row)


def test_a_plan_gives_the_new_rows_bytes_before_the_write_and_a_stale_one_is_refused(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    """The rows' bytes are known before anything is written (the snapshot caps its optional
    rewrites by them); the write of that plan writes exactly those rows; a plan made before
    the writer's last commit describes another base and is refused."""
    segments = tmp_path / "segments"

    async def main() -> None:
        writer = SegmentedWriter(segments)
        plane = make_plane(DataPlaneMutationCut())
        await plane.put(TRAIN_PARTITION, {"t_g0": sample_row(9)})
        await written(writer, plane, tmp_path / "s1", "000001")
        await plane.put(STAGING_PARTITION, {"s_g0": sample_row(3)})
        capture = plane.capture()
        plan = writer.plan(capture)
        assert plan.new_row_bytes == row_bytes("s_g0", sample_row(3))
        assert sorted(segment_files(segments)) == ["000001-train.segment.safetensors"]
        pending = writer.write(tmp_path / "s2", capture, USER, stem="000002", plan=plan)
        assert (pending.info.new_rows, pending.info.new_row_bytes) == (1, plan.new_row_bytes)
        writer.committed(pending)
        with pytest.raises(ValueError, match="before the writer's last committed checkpoint"):
            writer.write(tmp_path / "s3", capture, USER, stem="000003", plan=plan)
        assert not (tmp_path / "s3").exists()

    asyncio.run(main())
