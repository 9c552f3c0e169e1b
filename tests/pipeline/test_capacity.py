import asyncio

import pytest

from rollvault.controller.loop.capacity import ReplayCapacity


def test_acquire_waits_until_a_release() -> None:
    async def main() -> list[str]:
        capacity = ReplayCapacity(1)
        order: list[str] = []
        await capacity.acquire()

        async def second() -> None:
            await capacity.acquire()
            order.append("second acquired")

        task = asyncio.create_task(second())
        await asyncio.sleep(0)  # let it block (a yield, not a timing assumption)
        assert not task.done()
        order.append("release")
        capacity.release()
        await task
        return order

    assert asyncio.run(main()) == ["release", "second acquired"]


def test_restored_groups_overdraw_and_releases_pay_back_first() -> None:
    async def main() -> None:
        capacity = ReplayCapacity(2)
        capacity.take_restored(5)
        assert capacity.free == -3
        waiter = asyncio.create_task(capacity.acquire())
        for expected_free in (-2, -1, 0):
            capacity.release()
            await asyncio.sleep(0)
            assert capacity.free == expected_free and not waiter.done()
        capacity.release()
        await waiter
        assert capacity.free == 0

    asyncio.run(main())


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="at least 1 permit"):
        ReplayCapacity(0)
    with pytest.raises(ValueError, match="count must be >= 0"):
        ReplayCapacity(1).take_restored(-1)
