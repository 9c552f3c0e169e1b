"""gc_pause: the cyclic collector is off inside, and as it was before, afterwards."""

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
