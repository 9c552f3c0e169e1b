"""Running a suspect's rounds alone, so that a death is charged to the attempt that caused it.

When the process dies with several attempts in flight, the restore charges
each of them (:mod:`~rollvault.controller.snapshots.crash_evidence`): the one
that killed it is among them, but which is not known. If the suspects ran
side by side again, each further death would charge the innocent ones too,
and the prompts that run next to a poison one (its neighbours in the
dataloader's order, restored and redispatched with it every time) would run
out of budget with it. So a round of a suspect group
(:func:`~rollvault.controller.loop.retry_budget.was_interrupted`) runs alone:
it starts once no other round is in flight, and no other round starts until
it is done. A death during it is charged to it alone; a suspect that comes
through is a suspect no longer, and its next rounds share again.

A restarted run dispatches its suspects first, so when kills come from
outside faster than snapshots (each start killed before its first), an
innocent suspect's isolated round is in flight at each of them and charged
at each: this is why interruptions spend a budget of their own,
``rollout.max_interrupted_retries``, larger than the infra one
(:mod:`~rollvault.controller.loop.retry_budget`).

The cost is paid only after a death: the groups it interrupted run one
round at a time, once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class RoundIsolation:
    """A shared/exclusive lock over rounds of attempts, preferring the exclusive ones.

    Once an exclusive round waits, new shared rounds wait behind it, or a
    stream of ordinary rounds would keep a suspect from ever running. Waiting
    and releasing never hold the condition's lock across a suspension, so a
    release in a cancelled task cannot block.
    """

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextlib.asynccontextmanager
    async def round(self, *, alone: bool) -> AsyncIterator[None]:
        """Hold the lock for one round: exclusively when ``alone``, else shared."""
        await (self._acquire_exclusive() if alone else self._acquire_shared())
        try:
            yield
        finally:
            async with self._changed:
                if alone:
                    self._exclusive = False
                else:
                    self._shared -= 1
                self._changed.notify_all()

    @property
    def rounds_in_flight(self) -> int:
        """Rounds holding the lock now (an exclusive one counts as one)."""
        return self._shared + int(self._exclusive)

    async def _acquire_shared(self) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self._exclusive and self._waiting_exclusive == 0
            )
            self._shared += 1

    async def _acquire_exclusive(self) -> None:
        async with self._changed:
            self._waiting_exclusive += 1
            try:
                await self._changed.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting_exclusive -= 1
                # If this wait was cancelled, shared rounds waiting behind it may go now;
                # if not, they wake under the lock and see the exclusive round.
                self._changed.notify_all()
            self._exclusive = True
