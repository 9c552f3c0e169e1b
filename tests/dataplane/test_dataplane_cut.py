"""The data plane's mutations pass through the mutation cut; captures are isolated."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dataplane_stores
import pytest
from dataplane_helpers import PlaneFactory, assert_rows_identical, sample_row

from rollvault.cut import CheckpointInsideMutationError, DataPlaneMutationCut
from rollvault.dataplane import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneCapture,
    DataPlaneKeyError,
)

make_plane = dataplane_stores.make_plane  # the fixture: every test runs on every store


def test_put_and_clear_wait_while_a_checkpoint_holds_the_cut(make_plane: PlaneFactory) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        held, release = asyncio.Event(), asyncio.Event()
        put_started, clear_started = asyncio.Event(), asyncio.Event()

        async def checkpointer() -> None:
            async with cut.checkpoint():
                held.set()
                await release.wait()
                # Still inside the exclusive section: neither mutation got through.
                assert not plane.has(TRAIN_PARTITION, "new")
                assert plane.has(TRAIN_PARTITION, "old")

        async def putter() -> None:
            put_started.set()
            await plane.put(TRAIN_PARTITION, {"new": sample_row(2)})

        async def clearer() -> None:
            clear_started.set()
            await plane.clear(TRAIN_PARTITION, ["old"])

        await plane.put(TRAIN_PARTITION, {"old": sample_row(1)})
        async with asyncio.TaskGroup() as group:
            group.create_task(checkpointer())
            await held.wait()
            put_task = group.create_task(putter())
            clear_task = group.create_task(clearer())
            # Each task ran until it blocked: a put or clear that did not wait for
            # the cut has no suspension point and would already have finished.
            await put_started.wait()
            await clear_started.wait()
            assert not put_task.done() and not clear_task.done()
            assert not plane.has(TRAIN_PARTITION, "new")
            assert plane.has(TRAIN_PARTITION, "old")
            release.set()
        assert plane.keys(TRAIN_PARTITION) == ["new"]

    asyncio.run(main())


def test_each_put_and_clear_is_one_mutation(make_plane: PlaneFactory) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        assert cut.mutation_version == 1
        await plane.put(STAGING_PARTITION, {"x/0": sample_row(3)})
        assert cut.mutation_version == 2
        await plane.clear(TRAIN_PARTITION, ["a", "absent"])
        assert cut.mutation_version == 3
        # Inside an outer mutation section the calls nest: one version for all.
        async with cut.mutation():
            await plane.put(TRAIN_PARTITION, {"c": sample_row(4)})
            await plane.clear(STAGING_PARTITION, ["x/0"])
        assert cut.mutation_version == 4
        assert plane.keys(TRAIN_PARTITION) == ["b", "c"]

    asyncio.run(main())


def test_the_checkpoint_holder_may_mutate_without_deadlock(make_plane: PlaneFactory) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        async with cut.checkpoint():
            await plane.put(TRAIN_PARTITION, {"a": sample_row(1)})
            await plane.clear(TRAIN_PARTITION, ["a"])
        assert plane.row_count() == 0

    asyncio.run(main())


def test_a_failed_put_leaves_the_cut_usable(make_plane: PlaneFactory) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1)})
        with pytest.raises(Exception, match="already holds a different row"):
            await plane.put(TRAIN_PARTITION, {"a": sample_row(2)})
        assert cut.active_mutations == 0
        async with cut.checkpoint():
            capture = plane.capture()
        assert capture.keys(TRAIN_PARTITION) == ["a"]

    asyncio.run(main())


def test_capture_is_isolated_from_later_puts_and_clears(make_plane: PlaneFactory) -> None:
    async def main() -> DataPlaneCapture:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        await plane.put(STAGING_PARTITION, {"s/0": sample_row(3)})
        async with cut.checkpoint():
            capture = plane.capture()
        await plane.clear(TRAIN_PARTITION, ["a"])
        await plane.clear(STAGING_PARTITION, ["s/0"])
        await plane.put(TRAIN_PARTITION, {"c": sample_row(4)})
        await plane.put("extra", {"e": sample_row(5)})
        assert capture.mutation_version == 2
        return capture

    capture = asyncio.run(main())
    assert capture.partitions() == [STAGING_PARTITION, TRAIN_PARTITION]
    assert capture.keys(TRAIN_PARTITION) == ["a", "b"]
    assert capture.keys(STAGING_PARTITION) == ["s/0"]
    assert capture.row_counts() == {TRAIN_PARTITION: 2, STAGING_PARTITION: 1}
    assert capture.row_count == 3
    assert_rows_identical(dict(capture.rows(TRAIN_PARTITION)["a"]), sample_row(1))
    with pytest.raises(TypeError):
        capture.rows(TRAIN_PARTITION)["z"] = {}  # type: ignore[index]
    with pytest.raises(DataPlaneKeyError, match="partition 'extra' is not in this capture"):
        capture.rows("extra")


def test_saving_an_old_capture_writes_the_old_row_set(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        async with cut.checkpoint():
            capture = plane.capture()
        await plane.clear(TRAIN_PARTITION, ["a"])
        await plane.put(TRAIN_PARTITION, {"c": sample_row(3)})
        info = await plane.save_checkpoint(tmp_path / "dp", {}, capture)
        assert info.row_counts == {TRAIN_PARTITION: 2}

        restored = make_plane(DataPlaneMutationCut())
        await restored.load_checkpoint(tmp_path / "dp")
        assert restored.keys(TRAIN_PARTITION) == ["a", "b"]
        rows = await restored.get(TRAIN_PARTITION, ["a", "b"])
        assert_rows_identical(rows["a"], sample_row(1))
        assert_rows_identical(rows["b"], sample_row(2))

    asyncio.run(main())


def test_save_without_capture_takes_one_under_the_cut_and_refuses_inside_a_mutation(
    tmp_path: Path, make_plane: PlaneFactory
) -> None:
    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = make_plane(cut)
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1)})
        info = await plane.save_checkpoint(tmp_path / "one", {})
        assert info.row_counts == {TRAIN_PARTITION: 1}
        async with cut.mutation():
            with pytest.raises(CheckpointInsideMutationError):
                await plane.save_checkpoint(tmp_path / "two", {})
        assert not (tmp_path / "two").exists()

    asyncio.run(main())
