"""What only the TransferQueue store does: rows live in TransferQueue, deletes wait for captures,
and a snapshot restores into a freshly started TransferQueue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import dataplane_stores
import numpy as np
import pytest
from dataplane_helpers import assert_rows_identical, sample_row

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import STAGING_PARTITION, TRAIN_PARTITION, read_checkpoint

pytestmark = pytest.mark.slow  # every test here runs on a TransferQueue on Ray

restart_transfer_queue = dataplane_stores.restart_transfer_queue  # the fixture


def tq_keys() -> dict[str, list[str]]:
    """TransferQueue's own listing: its partitions and the keys in each."""
    import transfer_queue

    return {name: sorted(keys) for name, keys in transfer_queue.kv_list().items() if keys}


def test_rows_live_in_transfer_queue_and_clears_delete_them(
    restart_transfer_queue: Callable[[], None],
) -> None:
    from rollvault.dataplane.tq import TransferQueueDataPlane

    async def main() -> None:
        plane = TransferQueueDataPlane(DataPlaneMutationCut(), namespace="live")
        await plane.put(TRAIN_PARTITION, {"g1_g0": sample_row(1), "g1_g1": sample_row(2)})
        await plane.put(STAGING_PARTITION, {"g2_g0_a1/0": sample_row(3)})
        assert tq_keys()["live.train"] == ["g1_g0#0", "g1_g1#1"]
        assert tq_keys()["live.rollout_staging"] == ["g2_g0_a1/0#2"]
        await plane.clear(TRAIN_PARTITION, ["g1_g0"])
        assert tq_keys()["live.train"] == ["g1_g1#1"]
        # A key cleared and put again is a new TransferQueue row, never the old bytes.
        await plane.put(TRAIN_PARTITION, {"g1_g0": sample_row(4)})
        assert tq_keys()["live.train"] == ["g1_g0#3", "g1_g1#1"]
        got = await plane.get(TRAIN_PARTITION, ["g1_g0"])
        assert_rows_identical(got["g1_g0"], sample_row(4))
        await plane.clear(TRAIN_PARTITION, ["g1_g0", "g1_g1"])
        await plane.clear(STAGING_PARTITION, ["g2_g0_a1/0"])
        assert not [name for name in tq_keys() if name.startswith("live.")]

    asyncio.run(main())


def test_a_clear_waits_with_the_delete_until_captures_are_gone(
    restart_transfer_queue: Callable[[], None], tmp_path: Path
) -> None:
    from rollvault.dataplane.tq import TransferQueueDataPlane

    async def main() -> None:
        cut = DataPlaneMutationCut()
        plane = TransferQueueDataPlane(cut, namespace="pinned")
        await plane.put(TRAIN_PARTITION, {"a": sample_row(1), "b": sample_row(2)})
        async with cut.checkpoint():
            capture = plane.capture()
        trimmed = capture.without(TRAIN_PARTITION, ["b"])
        del capture  # the trimmed capture shares the pin
        await plane.clear(TRAIN_PARTITION, ["a", "b"])
        assert plane.keys(TRAIN_PARTITION) == []
        assert tq_keys()["pinned.train"] == ["a#0", "b#1"]
        assert plane.held_row_count() == 2
        info = await plane.save_checkpoint(tmp_path / "dp", {}, trimmed)
        assert info.row_counts == {TRAIN_PARTITION: 1}
        del trimmed
        # The writer's worker thread drops its reference just after the write returns,
        # which nothing signals: a poll of the count, with a deadline of 5 s.
        for _ in range(500):
            if not plane.held_row_count():
                break
            await asyncio.sleep(0.01)
        assert plane.held_row_count() == 0
        await plane.close()  # sends the deletes the capture held back
        assert "pinned.train" not in tq_keys()

    asyncio.run(main())
    loaded = read_checkpoint(tmp_path / "dp")
    assert_rows_identical(dict(loaded.partitions[TRAIN_PARTITION]["a"]), sample_row(1))


def test_a_snapshot_restores_into_a_freshly_started_transfer_queue(
    restart_transfer_queue: Callable[[], None], tmp_path: Path
) -> None:
    from rollvault.dataplane.tq import TransferQueueDataPlane

    rows = {f"g{i}_g0": sample_row(i, length=i % 5) for i in range(40)}
    rows["scalars_only"] = {"reward": -0.0, "ok": True}
    rows["nan"] = {"x": np.array([np.nan, -np.inf], dtype=np.float16)}

    async def save() -> None:
        plane = TransferQueueDataPlane(DataPlaneMutationCut())
        await plane.put(TRAIN_PARTITION, rows)
        await plane.put("emptied", {"gone": sample_row(1)})
        await plane.clear("emptied", ["gone"])
        await plane.save_checkpoint(tmp_path / "dp", {"step": 3})

    asyncio.run(save())
    restart_transfer_queue()  # a new Ray and TransferQueue: nothing of the old rows left
    assert tq_keys() == {}

    async def restore() -> None:
        plane = TransferQueueDataPlane(DataPlaneMutationCut(), namespace="restored")
        assert await plane.load_checkpoint(tmp_path / "dp") == {"step": 3}
        assert plane.partitions() == ["emptied", TRAIN_PARTITION]
        assert plane.keys(TRAIN_PARTITION) == sorted(rows)
        assert len(tq_keys()["restored.train"]) == len(rows)
        got = await plane.get(TRAIN_PARTITION, sorted(rows))
        for key, row in rows.items():
            assert_rows_identical(got[key], row)

    asyncio.run(restore())
