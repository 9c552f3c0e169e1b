"""Suspect rounds run alone: the shared/exclusive round lock."""

from __future__ import annotations

import asyncio

import pytest

from rollvault.controller.loop.isolation import RoundIsolation


async def hold(
    isolation: RoundIsolation,
    alone: bool,
    log: list[str],
    name: str,
    gate: asyncio.Event,
    entered: asyncio.Event | None = None,
) -> None:
    async with isolation.round(alone=alone):
        log.append(f"{name} in")
        if entered is not None:
            entered.set()
        await gate.wait()
        log.append(f"{name} out")


def test_ordinary_rounds_share_and_a_suspect_waits_for_them_then_runs_alone() -> None:
    async def main() -> list[str]:
        isolation = RoundIsolation()
        log: list[str] = []
        release_shared, release_suspect, release_late = (
            asyncio.Event(),
            asyncio.Event(),
            asyncio.Event(),
        )
        first = asyncio.create_task(hold(isolation, False, log, "a", release_shared))
        second = asyncio.create_task(hold(isolation, False, log, "b", release_shared))
        await asyncio.sleep(0)
        assert isolation.rounds_in_flight == 2
        suspect = asyncio.create_task(hold(isolation, True, log, "suspect", release_suspect))
        await asyncio.sleep(0)
        # A round that comes after the waiting suspect waits behind it.
        late = asyncio.create_task(hold(isolation, False, log, "late", release_late))
        await asyncio.sleep(0)
        assert log == ["a in", "b in"]
        release_shared.set()
        await asyncio.gather(first, second)
        await asyncio.sleep(0)
        assert log[-1] == "suspect in" and isolation.rounds_in_flight == 1
        # Released first: had the late round got in beside the suspect, it would come out
        # before it. The log below shows it entered only once the suspect was out.
        release_late.set()
        release_suspect.set()
        await asyncio.gather(suspect, late)
        return log

    assert asyncio.run(main()) == [
        "a in",
        "b in",
        "a out",
        "b out",
        "suspect in",
        "suspect out",
        "late in",
        "late out",
    ]


def test_a_suspect_cancelled_while_waiting_lets_the_others_go() -> None:
    async def main() -> None:
        isolation = RoundIsolation()
        log: list[str] = []
        release = asyncio.Event()
        running = asyncio.create_task(hold(isolation, False, log, "a", release))
        await asyncio.sleep(0)
        suspect = asyncio.create_task(hold(isolation, True, log, "suspect", asyncio.Event()))
        await asyncio.sleep(0)
        b_entered = asyncio.Event()
        waiting = asyncio.create_task(hold(isolation, False, log, "b", release, b_entered))
        await asyncio.sleep(0)
        assert log == ["a in"]
        suspect.cancel()
        # No suspect waits any more: b shares with a (the timeout only bounds a failure).
        await asyncio.wait_for(b_entered.wait(), timeout=10.0)
        assert log == ["a in", "b in"]
        release.set()
        await asyncio.gather(running, waiting)
        assert suspect.cancelled() and isolation.rounds_in_flight == 0

    asyncio.run(main())


def test_a_round_that_fails_releases_the_lock() -> None:
    async def main() -> None:
        isolation = RoundIsolation()
        with pytest.raises(ValueError, match="the round failed"):
            async with isolation.round(alone=True):
                raise ValueError("the round failed")
        assert isolation.rounds_in_flight == 0
        async with isolation.round(alone=False):
            assert isolation.rounds_in_flight == 1

    asyncio.run(main())
