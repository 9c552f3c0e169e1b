"""Data-plane checkpoints, for every store: exact round trip, and every kind of damage refused by name."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dataplane_stores
import msgspec
import numpy as np
import pytest
from dataplane_helpers import Plane, PlaneFactory, assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    METADATA_FILENAME,
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneCheckpointError,
    DataPlaneNotEmptyError,
    DataPlaneValidationError,
    LoadedCheckpoint,
    Row,
    keyed_store,
    read_checkpoint,
    read_checkpoint_metadata,
)

USER_METADATA: dict[str, Any] = {
    "sidecars": {
        "rollout_recovery.json": {"sha256": "ab" * 32, "schema_version": 3, "group_count": 2},
    },
    "note": "ünïcode ✓",
    "values": [1, 2.5, True, None, {"nested": []}],
}

make_plane = dataplane_stores.make_plane  # the fixture: every test runs on every store


def saved_rows() -> dict[str, dict[str, Row]]:
    """Several partitions: mixed dtypes, zero-length arrays, scalars only, and one empty."""
    return {
        TRAIN_PARTITION: {
            "g1_g0": sample_row(1),
            "g1_g1": sample_row(2, length=0),
            "g2_g0": {
                "input_ids": np.arange(4, dtype=np.int32),  # same field, other dtype
                "half": np.array([0.5, -0.0, np.inf], dtype=np.float16),
                "u": np.array([0, 2**64 - 1], dtype=np.uint64),
            },
        },
        STAGING_PARTITION: {
            "g1_g0_a0123/0": sample_row(7, length=3),
            "g1_g0_a0123/1": {"only_scalars": 1, "neg": -(2**63), "f": 1e-300},
        },
        "emptied": {},
    }


async def fill(plane: Plane, rows: dict[str, dict[str, Row]]) -> None:
    for partition, partition_rows in rows.items():
        await plane.put(partition, partition_rows)


def save(
    make_plane: PlaneFactory, directory: Path, rows: dict[str, dict[str, Row]] | None = None
) -> Path:
    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await fill(plane, saved_rows() if rows is None else rows)
        await plane.put("emptied", {"gone": sample_row(9)})
        await plane.clear("emptied", ["gone"])
        info = await plane.save_checkpoint(directory, USER_METADATA)
        on_disk = sum(path.stat().st_size for path in directory.iterdir())
        assert info.bytes_written == on_disk
        assert info.row_counts == {TRAIN_PARTITION: 3, STAGING_PARTITION: 2, "emptied": 0}

    asyncio.run(main())
    return directory


@pytest.fixture
def checkpoint(tmp_path: Path, make_plane: PlaneFactory) -> Path:
    return save(make_plane, tmp_path / "data_plane")


def load_into_fresh(make_plane: PlaneFactory, directory: Path) -> tuple[Plane, dict[str, Any]]:
    async def main() -> tuple[Plane, dict[str, Any]]:
        plane = make_plane(DataPlaneMutationCut())
        return plane, await plane.load_checkpoint(directory)

    return asyncio.run(main())


def assert_load_refused(
    make_plane: PlaneFactory, directory: Path, culprit: Path, message: str
) -> None:
    """Loading fails naming ``culprit``, and the store is left empty."""

    async def main() -> Plane:
        plane = make_plane(DataPlaneMutationCut())
        with pytest.raises(DataPlaneCheckpointError, match=message) as caught:
            await plane.load_checkpoint(directory)
        assert caught.value.path == culprit
        assert str(culprit) in str(caught.value)
        return plane

    plane = asyncio.run(main())
    assert plane.row_count() == 0
    assert plane.partitions() == []


def files_of(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def test_round_trip_is_exact(checkpoint: Path, make_plane: PlaneFactory) -> None:
    assert sorted(path.name for path in files_of(checkpoint)) == [
        "emptied.safetensors",
        METADATA_FILENAME,
        "rollout_staging.safetensors",
        "train.safetensors",
    ]
    plane, user_metadata = load_into_fresh(make_plane, checkpoint)
    assert user_metadata == USER_METADATA
    assert plane.partitions() == ["emptied", STAGING_PARTITION, TRAIN_PARTITION]
    for partition, rows in saved_rows().items():
        assert plane.keys(partition) == sorted(rows)
        loaded = asyncio.run(plane.get(partition, sorted(rows)))
        for key, row in rows.items():
            assert_rows_identical(loaded[key], row)
            for value in loaded[key].values():
                if isinstance(value, np.ndarray):
                    assert not value.flags.writeable


def test_metadata_alone_lists_rows_and_user_metadata(checkpoint: Path) -> None:
    content = read_checkpoint_metadata(checkpoint)
    assert content.user_metadata == USER_METADATA
    listed = {entry.name: [row.key for row in entry.rows] for entry in content.partitions}
    assert listed == {name: sorted(rows) for name, rows in saved_rows().items()}
    (staging,) = [entry for entry in content.partitions if entry.name == STAGING_PARTITION]
    assert staging.rows[0].arrays[0].length == 3
    assert staging.rows[1].scalars[1].value == -(2**63)


def test_each_loaded_array_owns_its_memory(checkpoint: Path) -> None:
    # Rows are sliced out of packed columns; a view would keep the whole column
    # alive until the last of its rows is cleared.
    loaded = read_checkpoint(checkpoint)
    arrays = [
        value
        for rows in loaded.partitions.values()
        for row in rows.values()
        for value in row.values()
        if isinstance(value, np.ndarray)
    ]
    assert len(arrays) == 12
    assert all(array.base is None for array in arrays)


def test_flipping_any_byte_of_metadata_json_is_detected(checkpoint: Path) -> None:
    path = checkpoint / METADATA_FILENAME
    original = path.read_bytes()
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(DataPlaneCheckpointError) as caught:
            read_checkpoint(checkpoint)
        assert caught.value.path == path, (position, caught.value)
    path.write_bytes(original)
    read_checkpoint(checkpoint)


@pytest.mark.parametrize(
    "name", ["train.safetensors", "rollout_staging.safetensors", "emptied.safetensors"]
)
def test_flipping_a_byte_of_a_partition_file_is_detected(
    checkpoint: Path, name: str, make_plane: PlaneFactory
) -> None:
    path = checkpoint / name
    original = path.read_bytes()
    for position in sorted({0, 8, len(original) // 2, len(original) - 1}):
        damaged = bytearray(original)
        damaged[position] ^= 0x01
        path.write_bytes(bytes(damaged))
        assert_load_refused(make_plane, checkpoint, path, "checksum mismatch")


@pytest.mark.parametrize(
    "name",
    [METADATA_FILENAME, "train.safetensors", "rollout_staging.safetensors", "emptied.safetensors"],
)
def test_truncating_each_file_is_detected(
    checkpoint: Path, name: str, make_plane: PlaneFactory
) -> None:
    path = checkpoint / name
    original = path.read_bytes()
    expected = "invalid metadata" if name == METADATA_FILENAME else "truncated"
    for length in sorted({0, len(original) // 2, len(original) - 1}):
        path.write_bytes(original[:length])
        assert_load_refused(make_plane, checkpoint, path, expected)


@pytest.mark.parametrize(
    "name",
    [METADATA_FILENAME, "train.safetensors", "rollout_staging.safetensors", "emptied.safetensors"],
)
def test_deleting_each_file_is_detected(
    checkpoint: Path, name: str, make_plane: PlaneFactory
) -> None:
    (checkpoint / name).unlink()
    assert_load_refused(make_plane, checkpoint, checkpoint / name, "missing file")


def test_an_extra_file_is_detected(checkpoint: Path, make_plane: PlaneFactory) -> None:
    extra = checkpoint / "stray.safetensors"
    extra.write_bytes(b"")
    assert_load_refused(make_plane, checkpoint, extra, "unexpected file")


def test_a_missing_directory_is_detected(tmp_path: Path, make_plane: PlaneFactory) -> None:
    assert_load_refused(
        make_plane, tmp_path / "nowhere", tmp_path / "nowhere", "not a checkpoint directory"
    )


def rewrite_envelope(checkpoint: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    path = checkpoint / METADATA_FILENAME
    envelope = json.loads(path.read_bytes())
    change(envelope)
    path.write_bytes(json.dumps(envelope).encode())
    return path


def rewrite_content(checkpoint: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """Edit ``content`` and re-sign it, as a consistent forgery would."""
    path = checkpoint / METADATA_FILENAME
    envelope = json.loads(path.read_bytes())
    change(envelope["content"])
    content = msgspec.json.encode(envelope["content"])
    envelope["content_sha256"] = hashlib.sha256(content).hexdigest()
    head = json.dumps({key: envelope[key] for key in ("schema_version", "content_sha256")})
    path.write_bytes(head[:-1].encode() + b', "content": ' + content + b"}")
    return path


def train_rows(content: dict[str, Any]) -> list[dict[str, Any]]:
    (train,) = [entry for entry in content["partitions"] if entry["name"] == TRAIN_PARTITION]
    rows: list[dict[str, Any]] = train["rows"]
    return rows


def test_rewrite_content_helper_produces_a_loadable_file(checkpoint: Path) -> None:
    rewrite_content(checkpoint, lambda content: None)
    assert read_checkpoint(checkpoint).user_metadata == USER_METADATA


def test_an_unknown_field_in_the_envelope_is_rejected(
    checkpoint: Path, make_plane: PlaneFactory
) -> None:
    path = rewrite_envelope(checkpoint, lambda envelope: envelope.update(extra=1))
    assert_load_refused(make_plane, checkpoint, path, "unknown field `extra`")


def test_unsupported_schema_version_is_rejected(checkpoint: Path, make_plane: PlaneFactory) -> None:
    path = rewrite_envelope(checkpoint, lambda envelope: envelope.update(schema_version=9))
    assert_load_refused(make_plane, checkpoint, path, "unsupported schema_version 9")


def test_a_changed_content_without_a_new_checksum_is_rejected(
    checkpoint: Path, make_plane: PlaneFactory
) -> None:
    def rename_key(envelope: dict[str, Any]) -> None:
        train_rows(envelope["content"])[0]["key"] = "g9_g0"

    path = rewrite_envelope(checkpoint, rename_key)
    assert_load_refused(make_plane, checkpoint, path, r"checksum mismatch: \$\.content hashes to")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda content: train_rows(content)[1].update(bogus=1),
            r"unknown field `bogus` - at `\$\.content\.partitions\[\d\]\.rows\[1\]`",
        ),
        (lambda content: content.update(bogus=1), r"unknown field `bogus` - at `\$\.content`"),
        (
            lambda content: train_rows(content)[0]["arrays"][0].__setitem__(2, "6"),
            r"Expected `int`, got `str` - at `\$\.content\.partitions\[\d\]\.rows\[0\]\.arrays\[0\]\[2\]`",
        ),
        (
            lambda content: train_rows(content)[0]["arrays"][0].__setitem__(1, "int128"),
            r"Invalid enum value 'int128' - at `\$\.content\.partitions\[\d\]\.rows\[0\]\.arrays\[0\]\[1\]`",
        ),
        (
            lambda content: content["partitions"][0].pop("byte_size"),
            r"missing required field `byte_size` - at `\$\.content\.partitions\[0\]`",
        ),
        (
            lambda content: content.update(user_metadata=[1]),
            r"Expected `object`, got `array` - at `\$\.content\.user_metadata`",
        ),
        (
            lambda content: train_rows(content)[2].update(key=train_rows(content)[0]["key"]),
            r"rows\[2\]\.key: duplicate key 'g1_g0' \(first at rows\[0\]\)",
        ),
        (
            lambda content: train_rows(content)[0]["scalars"].append(["input_ids", 1]),
            r"duplicate fields \['input_ids'\] in row 'g1_g0'",
        ),
        (
            lambda content: content["partitions"][0].update(file="other.safetensors"),
            r"partitions\[0\]\.file: 'other\.safetensors', expected",
        ),
        (
            lambda content: content["partitions"].append(dict(content["partitions"][0])),
            r"duplicate partition",
        ),
    ],
)
def test_schema_violations_are_rejected_with_their_path(
    checkpoint: Path,
    change: Callable[[dict[str, Any]], None],
    message: str,
    make_plane: PlaneFactory,
) -> None:
    path = rewrite_content(checkpoint, change)
    assert_load_refused(make_plane, checkpoint, path, message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda content: train_rows(content)[0]["arrays"][0].__setitem__(2, 5),
            r"tensor 'input_ids/int64' is int64\[6\], .* describes int64\[5\]",
        ),
        (
            lambda content: train_rows(content)[0]["arrays"][2].__setitem__(1, "uint8"),
            r"holds tensors .*describes columns .*'token_mask/uint8'",
        ),
    ],
)
def test_metadata_that_disagrees_with_the_tensors_is_rejected(
    checkpoint: Path,
    change: Callable[[dict[str, Any]], None],
    message: str,
    make_plane: PlaneFactory,
) -> None:
    rewrite_content(checkpoint, change)
    assert_load_refused(make_plane, checkpoint, checkpoint / "train.safetensors", message)


def test_load_refuses_a_non_empty_store_and_changes_nothing(
    checkpoint: Path, make_plane: PlaneFactory
) -> None:
    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await plane.put("mine", {"k": sample_row(1)})
        with pytest.raises(DataPlaneNotEmptyError, match="holds 1 rows"):
            await plane.load_checkpoint(checkpoint)
        assert plane.partitions() == ["mine"]
        assert plane.keys("mine") == ["k"]

    asyncio.run(main())


def test_a_put_while_the_files_are_read_makes_the_load_fail(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, make_plane: PlaneFactory
) -> None:
    reading, may_finish = threading.Event(), threading.Event()

    def read_when_allowed(directory: Path) -> LoadedCheckpoint:
        reading.set()
        may_finish.wait()
        return read_checkpoint(directory)

    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        # Both stores read through the base class's module (keyed_store).
        monkeypatch.setattr(keyed_store, "read_checkpoint", read_when_allowed)
        load = asyncio.create_task(plane.load_checkpoint(checkpoint))
        await asyncio.to_thread(reading.wait)
        await plane.put("mine", {"k": sample_row(1)})
        may_finish.set()
        with pytest.raises(DataPlaneNotEmptyError, match="holds 1 rows"):
            await load
        assert plane.partitions() == ["mine"]

    asyncio.run(main())


def test_load_into_a_store_with_only_empty_partitions_replaces_them(
    checkpoint: Path, make_plane: PlaneFactory
) -> None:
    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await plane.put("leftover", {})
        await plane.load_checkpoint(checkpoint)
        assert plane.partitions() == ["emptied", STAGING_PARTITION, TRAIN_PARTITION]

    asyncio.run(main())


def test_save_refuses_a_non_empty_directory(tmp_path: Path, make_plane: PlaneFactory) -> None:
    (tmp_path / "dp").mkdir()
    (tmp_path / "dp" / "old").write_bytes(b"x")
    with pytest.raises(DataPlaneCheckpointError, match=r"not empty \(holds \['old'\]\)"):
        save(make_plane, tmp_path / "dp")


@pytest.mark.parametrize(
    ("user_metadata", "message"),
    [
        ([1, 2], "must be a mapping"),
        ({"t": (1, 2)}, r"\$\.t: \(1, 2\) \(tuple\) comes back as \[1, 2\]"),
        ({"x": {"nan": float("nan")}}, r"\$\.x\.nan: nan"),
        ({"n": np.int64(3)}, "not JSON-encodable"),
        ({1: "a"}, r"\$: key 1 is not a str"),
    ],
)
def test_user_metadata_must_round_trip_through_json(
    tmp_path: Path, user_metadata: Any, message: str, make_plane: PlaneFactory
) -> None:
    async def main() -> None:
        plane = make_plane(DataPlaneMutationCut())
        await plane.put(TRAIN_PARTITION, {"k": sample_row(1)})
        with pytest.raises(DataPlaneValidationError, match=message):
            await plane.save_checkpoint(tmp_path / "dp", user_metadata)

    asyncio.run(main())
    assert not (tmp_path / "dp").exists()


def test_a_full_filesystem_fails_the_write_with_an_oserror(
    small_filesystem: Callable[[int], Path], make_plane: PlaneFactory
) -> None:
    big: dict[str, Row] = {f"g{i}_g0": {"x": np.arange(50_000, dtype=np.int64)} for i in range(4)}
    rows = {TRAIN_PARTITION: big}
    with pytest.raises(OSError, match="No space left on device") as caught:
        save(make_plane, small_filesystem(1 << 20) / "checkpoint", rows)
    assert caught.value.errno == errno.ENOSPC
