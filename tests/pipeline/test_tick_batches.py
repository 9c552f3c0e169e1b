"""TickBatch: what one turn of the event loop hands over is processed together."""

from __future__ import annotations

import asyncio

import pytest

from rollvault.controller.loop.tick_batches import Handed, TickBatch


class _Doubler:
    """Doubles each item; fails the odd ones it is told to."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.refuse = refuse or set()

    async def process(self, batch: list[Handed[int, int]]) -> None:
        self.batches.append([entry.item for entry in batch])
        await asyncio.sleep(0)  # a batch may await (the cut, a data-plane call)
        for entry in batch:
            if entry.item in self.refuse:
                entry.fail(ValueError(f"refused {entry.item}"))
            else:
                entry.settle(2 * entry.item)


def test_items_handed_over_in_one_loop_turn_are_processed_in_one_call() -> None:
    doubler = _Doubler(refuse={3})
    batches = TickBatch[int, int](doubler.process, name="double")

    async def caller(release: asyncio.Event, item: int) -> int | str:
        await release.wait()  # every caller wakes in the same turn, as a generation batch's
        try:
            return await batches.submit(item)
        except ValueError as error:
            return str(error)

    async def run() -> tuple[list[int | str], list[int | str]]:
        first, second = asyncio.Event(), asyncio.Event()
        waiting = [asyncio.create_task(caller(first, i)) for i in range(5)]
        later = [asyncio.create_task(caller(second, i)) for i in (10, 11)]
        await asyncio.sleep(0)
        first.set()
        done = await asyncio.gather(*waiting)
        second.set()
        return list(done), list(await asyncio.gather(*later))

    done, later = asyncio.run(run())
    assert done == [0, 2, 4, "refused 3", 8]  # a refusal fails its own caller only
    assert later == [20, 22]
    assert doubler.batches == [[0, 1, 2, 3, 4], [10, 11]]
    assert (batches.batches, batches.items) == (2, 7)


def test_an_error_of_the_batch_reaches_every_caller_and_unsettled_items_fail() -> None:
    async def broken(batch: list[Handed[int, int]]) -> None:
        raise OSError("disk full")

    async def forgetful(batch: list[Handed[int, int]]) -> None:
        batch[0].settle(1)  # the second is left unsettled: a bug, not a hang

    async def run() -> tuple[list[BaseException | int], list[BaseException | int]]:
        failing = TickBatch[int, int](broken, name="broken")
        partial = TickBatch[int, int](forgetful, name="forgetful")
        first = await asyncio.gather(failing.submit(1), failing.submit(2), return_exceptions=True)
        second = await asyncio.gather(partial.submit(1), partial.submit(2), return_exceptions=True)
        return list(first), list(second)

    first, second = asyncio.run(run())
    assert [str(error) for error in first] == ["disk full", "disk full"]
    assert second[0] == 1
    assert isinstance(second[1], RuntimeError) and "forgetful" in str(second[1])


def test_a_caller_cancelled_before_its_batch_runs_is_left_out() -> None:
    seen: list[list[int]] = []

    async def process(batch: list[Handed[int, int]]) -> None:
        seen.append([entry.item for entry in batch])
        for entry in batch:
            entry.settle(entry.item)

    async def run() -> int:
        batches = TickBatch[int, int](process, name="cancel")
        gone = asyncio.create_task(batches.submit(1))
        kept = asyncio.create_task(batches.submit(2))
        await asyncio.sleep(0)  # both handed over; the batch task is scheduled behind them
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await kept

    assert asyncio.run(run()) == 2
    assert seen == [[2]]


def test_a_started_batch_ends_though_its_caller_is_cancelled_and_drain_waits_for_it() -> None:
    gate = asyncio.Event()
    processed: list[int] = []

    async def slow(batch: list[Handed[int, int]]) -> None:
        await gate.wait()  # e.g. the cut, held by a checkpoint
        for entry in batch:
            processed.append(entry.item)
            entry.settle(entry.item)

    batches = TickBatch[int, int](slow, name="slow")

    async def run() -> tuple[list[int], list[int]]:
        caller = asyncio.create_task(batches.submit(7))
        await asyncio.sleep(0)  # the caller hands over and the batch starts
        await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        before = list(processed)
        draining = asyncio.create_task(batches.drain())
        await asyncio.sleep(0)
        assert not draining.done()  # the batch is still waiting: drain waits with it
        gate.set()
        await draining
        return before, list(processed)

    before, after = asyncio.run(run())
    assert before == [] and after == [7]
