"""A model worker's queue of generation requests, cut into batches at group boundaries.

The local model gate's worker and each Ray pool lane generate a batch of
requests at a time. Both take whole prompt groups when they can (a group
split over two batches could see two weight versions), and when a group
larger than a batch must be split, its next batch *holds* the worker's
weights so every sibling of the group is generated under one version.
:class:`GroupBatchQueue` is that queue and that rule, written once.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Protocol, TypeVar


class WaitingRequest(Protocol):
    """What the queue needs of a waiting request: its group and the future its caller awaits."""

    @property
    def group_id(self) -> str: ...

    @property
    def future(self) -> asyncio.Future[Any]: ...


Request = TypeVar("Request", bound=WaitingRequest)


def batch_size(group_ids: list[str], max_batch_size: int) -> int:
    """How many of the waiting requests (their groups, in queue order) the next batch takes.

    At most ``max_batch_size``, ending at a group boundary: a group that would
    not fit whole waits for the next batch, unless it starts the batch (a group
    larger than a batch is split; the hold keeps its version).
    """
    size = min(max_batch_size, len(group_ids))
    if size == len(group_ids) or group_ids[size] != group_ids[size - 1]:
        return size
    start = size - 1
    while start > 0 and group_ids[start - 1] == group_ids[size - 1]:
        start -= 1
    return start if start > 0 else size


class GroupBatchQueue(Generic[Request]):
    """Requests waiting for the worker, in arrival order; owned by one dispatcher task."""

    def __init__(self, max_batch_size: int) -> None:
        self._max_batch_size = max_batch_size
        self._waiting: list[Request] = []
        self._held_groups: set[str] = set()
        """Groups split by the last batch with siblings still waiting: their next batch holds."""

    def __len__(self) -> int:
        return len(self._waiting)

    def append(self, request: Request) -> None:
        self._waiting.append(request)

    def next_batch(self) -> tuple[list[Request], bool]:
        """The next batch, and whether it must keep the worker's weights (the hold)."""
        # Requests cancelled while they waited take no room in a batch.
        self._waiting = [request for request in self._waiting if not request.future.done()]
        size = batch_size([request.group_id for request in self._waiting], self._max_batch_size)
        batch = self._waiting[:size]
        del self._waiting[:size]
        in_batch = {request.group_id for request in batch}
        hold = not self._held_groups.isdisjoint(in_batch)
        waiting = {request.group_id for request in self._waiting}
        self._held_groups = (self._held_groups | in_batch) & waiting
        return batch, hold

    def take_all(self) -> list[Request]:
        """Empty the queue and return what waited (to send it elsewhere); no group is held."""
        taken, self._waiting = self._waiting, []
        self._held_groups.clear()
        return taken

    def cancel_all(self) -> None:
        """Cancel every waiting request's future and empty the queue."""
        for request in self.take_all():
            request.future.cancel()

    def fail_all(self, error: Exception) -> None:
        """Fail every waiting request's future with ``error`` and empty the queue."""
        for request in self.take_all():
            fail_request(request, error)


def fail_request(request: WaitingRequest, error: Exception) -> None:
    """Fail ``request``'s future with ``error`` unless it is already done (cancelled, say)."""
    if not request.future.done():
        request.future.set_exception(error)
