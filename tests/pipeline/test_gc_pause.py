"""gc_pause: the cyclic collector is off inside, as it was before afterwards, and what a normal
pause built is frozen."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from rollvault.controller.snapshots.gc_pause import cyclic_gc_paused, gc_paused_async


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    if not was_enabled:
        gc.disable()


def test_the_collector_is_paused_inside_and_resumes_after_an_error() -> None:
    with pytest.raises(ValueError, match="inside"), cyclic_gc_paused():
        assert not gc.isenabled()
        raise ValueError("inside")
    assert gc.isenabled()


def test_a_nested_pause_leaves_the_collector_off_for_the_outer_one() -> None:
    with cyclic_gc_paused():
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    with cyclic_gc_paused():
        pass
    assert not gc.isenabled()


def test_a_decorated_coroutine_runs_paused_and_returns_its_value() -> None:
    @gc_paused_async
    async def work(value: int) -> tuple[int, bool]:
        await asyncio.sleep(0)
        return value, gc.isenabled()

    assert asyncio.run(work(7)) == (7, False)
    assert gc.isenabled()


def _frozen(obj: object) -> bool:
    """Whether ``obj`` is in the collector's permanent generation (``gc.freeze``).

    Checked by identity, not by ``gc.get_freeze_count()``: frozen objects elsewhere in
    the process (a suite's earlier runs) are freed by reference counting at any moment,
    which moves the count.
    """
    assert gc.is_tracked(obj)
    return all(tracked is not obj for tracked in gc.get_objects())  # generations 0-2 only


def test_what_a_normal_pause_built_is_frozen_and_later_cycles_are_still_collected() -> None:
    with cyclic_gc_paused():
        built = [[index] for index in range(100)]
    # The run's state stays out of every later collection.
    assert all(_frozen(item) for item in built[:3]) and _frozen(built)

    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1  # a cycle made after the pause is collected as ever


def test_a_pause_that_raises_freezes_nothing() -> None:
    built: list[list[int]] = []
    with pytest.raises(ValueError, match="corrupt"), cyclic_gc_paused():
        built.extend([index] for index in range(100))
        raise ValueError("corrupt")
    assert not _frozen(built) and not _frozen(built[0])
    assert gc.isenabled()


def test_a_nested_pause_freezes_only_when_the_outer_one_ends() -> None:
    with cyclic_gc_paused():
        with cyclic_gc_paused():
            built = [[index] for index in range(100)]
        assert not _frozen(built)
    assert _frozen(built)
