"""Work handed over in one turn of the event loop, done together.

A model gate's worker returns a whole generation batch at once: every
attempt of the batch resumes in the same turn of the event loop and hands
over the same kind of work (seal me). :class:`TickBatch` collects what is
handed over until the loop gets to a task it schedules behind them, then
runs one callback over all of it (one mutation section, one log write), and
gives each caller its own result or error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Handed", "TickBatch"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


@dataclass(slots=True)
class Handed(Generic[ItemT, ResultT]):
    """One caller's item and the future its result (or error) goes to."""

    item: ItemT
    done: asyncio.Future[ResultT] = field(repr=False)

    def settle(self, result: ResultT) -> None:
        if not self.done.done():
            self.done.set_result(result)

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class TickBatch(Generic[ItemT, ResultT]):
    """Runs ``process`` once over the items handed over in one turn of the event loop.

    ``process`` settles each :class:`Handed` it is given (``settle``/``fail``);
    one it leaves unsettled fails with a RuntimeError naming the batch, and an
    error ``process`` raises goes to every caller still waiting. An item whose
    caller was cancelled before its batch started is not passed on; a batch
    that started runs to its end even if its callers are cancelled (its work is
    one mutation section and must not stop half done), and its owner awaits it
    with :meth:`drain` before it goes on (no batch outlives the pump).
    """

    def __init__(
        self, process: Callable[[list[Handed[ItemT, ResultT]]], Awaitable[None]], *, name: str
    ) -> None:
        self._process = process
        self._name = name
        self._waiting: list[Handed[ItemT, ResultT]] = []
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()
        """Batch tasks still running (the loop keeps only weak references to tasks)."""
        self.batches = 0
        self.items = 0

    async def submit(self, item: ItemT) -> ResultT:
        """Hand ``item`` over and wait for its batch's result."""
        done: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._waiting.append(Handed(item, done))
        if not self._scheduled:
            # Behind the tasks already woken in this turn, so it finds their items too.
            self._scheduled = True
            task = asyncio.create_task(self._run(), name=self._name)
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await done

    async def drain(self) -> None:
        """Wait until every batch already started has ended."""
        while self._running:
            await asyncio.wait(list(self._running))

    async def _run(self) -> None:
        handed, self._waiting = self._waiting, []
        self._scheduled = False
        live = [entry for entry in handed if not entry.done.done()]
        if not live:
            return
        self.batches += 1
        self.items += len(live)
        try:
            await self._process(live)
        except asyncio.CancelledError:
            for entry in live:
                entry.done.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - raised in every caller still waiting
            for entry in live:
                entry.fail(error)
        for entry in live:
            entry.fail(RuntimeError(f"{self._name}: the batch left an item unsettled"))
