"""Replay-capacity permits that a restore may overdraw.

A prompt group holds one permit from reservation until it is trained (or
lost without replacement). A restore brings back groups that already held
permits, and possibly more of them than the capacity: groups trained since
the last trainer checkpoint come back to be trained again. Waiting for those
permits before the pumps start would deadlock, so restore takes them as an
overdraft: the free count goes negative, releases pay it back first, and new
reservations wait until a permit is really free.
"""

from __future__ import annotations

import asyncio


class ReplayCapacity:
    """``max_buffered_rollouts`` permits; restore may overdraw them."""

    def __init__(self, permits: int) -> None:
        if permits < 1:
            raise ValueError(f"ReplayCapacity needs at least 1 permit, got {permits}")
        self._free = permits
        self._available = asyncio.Event()
        self._available.set()

    @property
    def free(self) -> int:
        """Free permits; negative while restored groups overdraw the capacity."""
        return self._free

    async def acquire(self) -> None:
        """Take one permit for a new group; waits while none is free."""
        while self._free <= 0:
            self._available.clear()
            await self._available.wait()
        self._free -= 1

    def take_restored(self, count: int) -> None:
        """Take ``count`` permits for restored groups at once, overdrawing if needed."""
        if count < 0:
            raise ValueError(f"ReplayCapacity.take_restored: count must be >= 0, got {count}")
        self._free -= count

    def release(self) -> None:
        """Give one permit back."""
        self._free += 1
        if self._free > 0:
            self._available.set()
