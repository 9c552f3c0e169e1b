"""Where a model worker's queue is cut into batches: at group boundaries, with the hold."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from rollvault.gates.group_batches import GroupBatchQueue, batch_size


@pytest.mark.parametrize(
    ("groups", "max_batch_size", "expected"),
    [
        ([], 4, 0),
        (["a", "a"], 4, 2),  # everything waiting fits
        (["a", "a", "b", "b"], 4, 4),  # the batch ends exactly at a boundary
        (["a", "a", "a", "b", "b", "b"], 4, 3),  # b would be split: it waits
        (["a", "b", "b", "b", "b"], 4, 1),
        (["a", "a", "a", "a", "a", "b"], 4, 4),  # a alone is larger than a batch
        (["a", "a", "a", "a", "b"], 4, 4),
        (["a", "b", "c"], 2, 2),
        (["a", "a"], 1, 1),
    ],
)
def test_a_batch_splits_no_group_that_does_not_start_it(
    groups: list[str], max_batch_size: int, expected: int
) -> None:
    assert batch_size(groups, max_batch_size) == expected


_LOOP: asyncio.AbstractEventLoop = asyncio.new_event_loop()
"""Futures need a loop to belong to; nothing here runs on it."""


@dataclass
class _Request:
    group_id: str
    future: asyncio.Future[int] = field(default_factory=lambda: _LOOP.create_future())


def _queue(groups: str, max_batch_size: int) -> GroupBatchQueue[_Request]:
    queue: GroupBatchQueue[_Request] = GroupBatchQueue(max_batch_size)
    for group in groups:
        queue.append(_Request(group))
    return queue


def _groups(batch: list[_Request]) -> str:
    return "".join(request.group_id for request in batch)


def test_a_split_group_holds_the_weights_until_its_last_sibling_has_started() -> None:
    queue = _queue("aaaaaabbb", 4)
    batch, hold = queue.next_batch()
    assert (_groups(batch), hold) == ("aaaa", False)
    batch, hold = queue.next_batch()
    # The rest of a (split) must be generated under the version its first part saw.
    assert (_groups(batch), hold) == ("aa", True)
    batch, hold = queue.next_batch()
    assert (_groups(batch), hold) == ("bbb", False)
    assert len(queue) == 0


def test_a_cancelled_request_takes_no_room_in_a_batch() -> None:
    queue = _queue("aab", 2)
    first = queue.take_all()
    first[0].future.cancel()
    for request in first:
        queue.append(request)
    batch, hold = queue.next_batch()
    assert (_groups(batch), hold) == ("ab", False)


def test_taking_everything_forgets_the_hold_and_failing_reaches_every_caller() -> None:
    queue = _queue("aaab", 2)
    queue.next_batch()  # a is split: its next batch would hold
    moved = queue.take_all()
    assert _groups(moved) == "ab" and len(queue) == 0
    for request in moved:
        queue.append(request)
    assert queue.next_batch()[1] is False  # a new queue owner starts with no hold

    queue = _queue("ab", 4)
    waiting = queue.take_all()
    for request in waiting:
        queue.append(request)
    waiting[1].future.cancel()
    queue.fail_all(RuntimeError("worker lost"))
    assert isinstance(waiting[0].future.exception(), RuntimeError)
    assert waiting[1].future.cancelled() and len(queue) == 0
