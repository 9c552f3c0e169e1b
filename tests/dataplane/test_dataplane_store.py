"""Put/get/keys/clear semantics and row validation, for every store (``make_plane``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import dataplane_stores
import numpy as np
import pytest
from dataplane_helpers import Plane, PlaneFactory, assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneConflictError,
    DataPlaneFieldError,
    DataPlaneKeyError,
    DataPlaneValidationError,
)

make_plane = dataplane_stores.make_plane  # the fixture: every test runs on every store


def run(make_plane: PlaneFactory, scenario: Callable[[Plane], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await scenario(make_plane(DataPlaneMutationCut()))

    return asyncio.run(main())


def test_put_then_get_returns_identical_rows_with_all_fields(make_plane: PlaneFactory) -> None:
    rows = {"g1_g0": sample_row(1), "g1_g1": sample_row(2, length=0)}

    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, rows)
        got = await plane.get(TRAIN_PARTITION, ["g1_g1", "g1_g0"])
        assert list(got) == ["g1_g1", "g1_g0"]
        for key, row in rows.items():
            assert_rows_identical(got[key], row)

    run(make_plane, scenario)


def test_get_selects_fields(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"k": sample_row(3)})
        got = await plane.get(TRAIN_PARTITION, ["k"], fields=["reward", "input_ids"])
        assert set(got["k"]) == {"reward", "input_ids"}
        assert got["k"]["reward"] == 0.75

    run(make_plane, scenario)


def test_get_missing_key_and_field_name_partition_key_and_field(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"k": sample_row(3)})
        with pytest.raises(DataPlaneKeyError, match=r"partition 'train' has no key 'absent'"):
            await plane.get(TRAIN_PARTITION, ["k", "absent"])
        with pytest.raises(KeyError):
            await plane.get(STAGING_PARTITION, ["k"])
        with pytest.raises(
            DataPlaneFieldError, match=r"partition 'train', key 'k' has no field 'nope'"
        ):
            await plane.get(TRAIN_PARTITION, ["k"], fields=["reward", "nope"])

    run(make_plane, scenario)


def test_a_bare_string_is_not_taken_for_a_list_of_keys(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"k": sample_row(3)})
        with pytest.raises(DataPlaneValidationError, match="sequence of str"):
            await plane.clear(TRAIN_PARTITION, "k")
        with pytest.raises(DataPlaneValidationError, match="sequence of str"):
            await plane.get(TRAIN_PARTITION, "k")
        with pytest.raises(DataPlaneValidationError, match="sequence of str"):
            await plane.get(TRAIN_PARTITION, ["k"], fields="reward")
        assert plane.has(TRAIN_PARTITION, "k")

    run(make_plane, scenario)


def test_keys_has_partitions_and_row_count(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        assert plane.partitions() == []
        assert plane.keys(TRAIN_PARTITION) == []
        await plane.put(TRAIN_PARTITION, {"b": sample_row(1), "a": sample_row(2)})
        await plane.put(STAGING_PARTITION, {"x_a1/0": sample_row(3)})
        assert plane.keys(TRAIN_PARTITION) == ["a", "b"]
        assert plane.partitions() == [STAGING_PARTITION, TRAIN_PARTITION]
        assert plane.has(TRAIN_PARTITION, "a")
        assert not plane.has(STAGING_PARTITION, "a")
        assert plane.row_count() == 3
        assert plane.row_count(TRAIN_PARTITION) == 2

    run(make_plane, scenario)


def test_clear_removes_keys_and_counts_absent_ones(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        await plane.clear(TRAIN_PARTITION, iter(["a", "never-there"]))
        await plane.clear("unknown_partition", ["z"])
        assert plane.keys(TRAIN_PARTITION) == ["b"]
        assert plane.absent_clear_count() == 2
        await plane.clear(TRAIN_PARTITION, ["b"])
        # An emptied partition still exists: its emptiness is part of a checkpoint.
        assert plane.partitions() == [TRAIN_PARTITION]
        assert plane.row_count() == 0

    run(make_plane, scenario)


def test_identical_put_is_idempotent_and_conflicting_put_changes_nothing(
    make_plane: PlaneFactory,
) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1)})
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        assert plane.keys(TRAIN_PARTITION) == ["a", "b"]
        changed = sample_row(1)
        logprobs = np.array(changed["generation_logprobs"])
        logprobs[0] += 1
        changed["generation_logprobs"] = logprobs
        with pytest.raises(
            DataPlaneConflictError,
            match=r"partition 'train', key 'a' .*field 'generation_logprobs': array values differ",
        ):
            await plane.put(TRAIN_PARTITION, {"c": sample_row(3), "a": changed})
        assert plane.keys(TRAIN_PARTITION) == ["a", "b"]
        assert_rows_identical((await plane.get(TRAIN_PARTITION, ["a"]))["a"], sample_row(1))

    run(make_plane, scenario)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"reward": 0.26}, r"field 'reward': 0\.25 stored, 0\.26 new"),
        ({"reward": 1}, r"field 'reward': float stored, int new"),
        ({"extra": 1}, "fields differ"),
        ({"input_ids": np.arange(6, dtype=np.int32)}, "dtype int64 stored, int32 new"),
        ({"input_ids": np.arange(7, dtype=np.int64)}, "length 6 stored, 7 new"),
        ({"length": np.arange(6)}, "int stored, ndarray new"),
    ],
)
def test_conflicts_say_what_differs(
    change: dict[str, Any], problem: str, make_plane: PlaneFactory
) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1)})
        with pytest.raises(DataPlaneConflictError, match=problem):
            await plane.put(TRAIN_PARTITION, {"a": {**sample_row(1), **change}})

    run(make_plane, scenario)


def test_negative_zero_and_nan_payloads_compare_bitwise(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        nan_row = {"x": np.array([np.nan, 1.0])}
        await plane.put(TRAIN_PARTITION, {"nan": nan_row, "zero": {"s": 0.0}})
        await plane.put(TRAIN_PARTITION, {"nan": {"x": np.array([np.nan, 1.0])}})
        with pytest.raises(DataPlaneConflictError, match="field 's'"):
            await plane.put(TRAIN_PARTITION, {"zero": {"s": -0.0}})

    run(make_plane, scenario)


@pytest.mark.parametrize(
    ("partition", "key", "row", "message"),
    [
        ("", "k", {}, "invalid partition name ''"),
        ("../up", "k", {}, r"invalid partition name '\.\./up'"),
        ("train", "", {}, "partition 'train': row key must be a non-empty str"),
        ("train", "k", [1, 2], "partition 'train', key 'k': a row must be a mapping"),
        (
            "train",
            "k",
            {"": np.arange(3)},
            "partition 'train', key 'k': field name must be a non-empty str",
        ),
        ("train", "k", {3: np.arange(3)}, "field name must be a non-empty str, got 3"),
        (
            "train",
            "k",
            {"ids": np.zeros((2, 3))},
            r"key 'k', field 'ids': arrays must be 1-D, got shape \(2, 3\)",
        ),
        ("train", "k", {"ids": np.array(5)}, r"field 'ids': arrays must be 1-D, got shape \(\)"),
        ("train", "k", {"ids": np.array(["a"])}, "field 'ids': unsupported array dtype <U1"),
        ("train", "k", {"ids": np.array([1j])}, "field 'ids': unsupported array dtype complex128"),
        ("train", "k", {"ids": np.array([None])}, "field 'ids': unsupported array dtype object"),
        ("train", "k", {"ids": [1, 2, 3]}, "field 'ids': unsupported value of type list"),
        ("train", "k", {"r": "1.0"}, "field 'r': unsupported value of type str"),
        ("train", "k", {"r": None}, "field 'r': unsupported value of type NoneType"),
        ("train", "k", {"r": float("nan")}, "field 'r': float scalar nan is not finite"),
        ("train", "k", {"r": float("-inf")}, "field 'r': float scalar -inf is not finite"),
        (
            "train",
            "k",
            {"r": 2**63},
            "field 'r': int scalar 9223372036854775808 does not fit in int64",
        ),
    ],
)
def test_put_rejects_malformed_input_naming_where(
    partition: str, key: str, row: Any, message: str, make_plane: PlaneFactory
) -> None:
    async def scenario(plane: Plane) -> None:
        with pytest.raises(DataPlaneValidationError, match=message):
            await plane.put(partition, {key: row, "good": sample_row(1)})
        assert plane.row_count() == 0

    run(make_plane, scenario)


def test_numpy_scalars_are_stored_as_python_scalars_and_big_endian_arrays_as_native(
    make_plane: PlaneFactory,
) -> None:
    async def scenario(plane: Plane) -> None:
        big_endian = np.arange(4, dtype=">i4")
        await plane.put(
            TRAIN_PARTITION,
            {
                "k": {
                    "f": np.float32(0.5),
                    "i": np.int64(-3),
                    "b": np.bool_(True),
                    "ids": big_endian,
                }
            },
        )
        row = (await plane.get(TRAIN_PARTITION, ["k"]))["k"]
        assert (type(row["f"]), type(row["i"]), type(row["b"])) == (float, int, bool)
        assert (row["f"], row["i"], row["b"]) == (0.5, -3, True)
        ids = row["ids"]
        assert isinstance(ids, np.ndarray)
        assert ids.dtype == np.dtype("int32") and ids.dtype.isnative
        assert ids.tolist() == [0, 1, 2, 3]

    run(make_plane, scenario)


def test_stored_arrays_are_read_only_copies(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        source = np.arange(5, dtype=np.int64)
        await plane.put(TRAIN_PARTITION, {"k": {"ids": source}})
        source[0] = 99  # the caller's buffer stays theirs
        ids = (await plane.get(TRAIN_PARTITION, ["k"]))["k"]["ids"]
        assert isinstance(ids, np.ndarray)
        assert ids.tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="read-only"):
            ids[0] = 7
        assert source.flags.writeable

    run(make_plane, scenario)


def test_mutating_a_returned_row_dict_does_not_change_the_store(make_plane: PlaneFactory) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.put(TRAIN_PARTITION, {"k": sample_row(1)})
        row = (await plane.get(TRAIN_PARTITION, ["k"]))["k"]
        row["reward"] = 100.0
        del row["input_ids"]
        assert_rows_identical((await plane.get(TRAIN_PARTITION, ["k"]))["k"], sample_row(1))

    run(make_plane, scenario)


def test_capture_without_drops_only_the_named_keys(make_plane: PlaneFactory) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        store = make_plane(cut)
        row = {"input_ids": np.arange(3, dtype=np.int64)}
        await store.put("train", {"a": row, "b": row})
        await store.put("rollout_staging", {"a": row})
        capture = store.capture()
        trimmed = capture.without("train", ["a", "absent"])
        assert trimmed.keys("train") == ["b"]
        assert trimmed.keys("rollout_staging") == ["a"]
        assert capture.keys("train") == ["a", "b"]
        assert trimmed.mutation_version == capture.mutation_version

    asyncio.run(main())
