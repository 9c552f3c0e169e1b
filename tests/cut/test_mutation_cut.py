"""Concurrency tests of the mutation cut (issue 2, section 3).

Steps are ordered with asyncio.Event only. A task that sets an event and then
enters a section runs, without yielding, up to the point where the section
blocks, so once the test's main task wakes on that event the other task is
known to be waiting. The order of entries in a shared log is what each test
asserts. ``asyncio.timeout`` is only a liveness guard: a deadlock fails the
test instead of hanging the suite; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from rollvault.cut import (
    CheckpointInsideMutationError,
    DataPlaneMutationCut,
    MutationCutNotHeldError,
)

LIVENESS_GUARD_S = 10


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        async with asyncio.timeout(LIVENESS_GUARD_S):
            await test()

    asyncio.run(guarded())


async def hold_mutation(
    cut: DataPlaneMutationCut,
    log: list[str],
    name: str,
    entered: asyncio.Event,
    release: asyncio.Event,
) -> None:
    async with cut.mutation():
        log.append(f"{name} in")
        entered.set()
        await release.wait()
        log.append(f"{name} out")


async def hold_checkpoint(
    cut: DataPlaneMutationCut,
    log: list[str],
    name: str,
    requested: asyncio.Event,
    release: asyncio.Event,
) -> None:
    requested.set()
    async with cut.checkpoint():
        log.append(f"{name} in")
        await release.wait()
        log.append(f"{name} out")


async def request_mutation(
    cut: DataPlaneMutationCut, log: list[str], name: str, requested: asyncio.Event
) -> None:
    requested.set()
    async with cut.mutation():
        log.append(f"{name} in")


def test_checkpoint_waits_for_running_mutation_and_blocks_new_ones() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        a_in, a_release = asyncio.Event(), asyncio.Event()
        c_requested, c_release = asyncio.Event(), asyncio.Event()
        b_requested = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_mutation(cut, log, "A", a_in, a_release))
            await a_in.wait()
            tasks.create_task(hold_checkpoint(cut, log, "C", c_requested, c_release))
            await c_requested.wait()
            tasks.create_task(request_mutation(cut, log, "B", b_requested))
            await b_requested.wait()
            # A is inside, C waits for it, B waits behind C.
            assert log == ["A in"]
            assert cut.active_mutations == 1
            a_release.set()
            c_release.set()
        assert log == ["A in", "A out", "C in", "C out", "B in"]

    run(scenario)


def test_waiting_checkpoint_is_not_starved_by_a_stream_of_new_mutations() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        a_in, a_release = asyncio.Event(), asyncio.Event()
        c_requested, c_release = asyncio.Event(), asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_mutation(cut, log, "A", a_in, a_release))
            await a_in.wait()
            tasks.create_task(hold_checkpoint(cut, log, "C", c_requested, c_release))
            await c_requested.wait()
            for number in range(5):
                requested = asyncio.Event()
                tasks.create_task(request_mutation(cut, log, f"M{number}", requested))
                await requested.wait()
            a_release.set()
            c_release.set()
        assert log[:4] == ["A in", "A out", "C in", "C out"]
        assert sorted(log[4:]) == [f"M{number} in" for number in range(5)]

    run(scenario)


def test_many_mutation_sections_run_at_once() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        a_in, b_in, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_mutation(cut, log, "A", a_in, release))
            tasks.create_task(hold_mutation(cut, log, "B", b_in, release))
            await a_in.wait()
            await b_in.wait()
            assert cut.active_mutations == 2
            release.set()
        assert cut.active_mutations == 0

    run(scenario)


def test_reentrant_mutation_does_not_deadlock_even_with_a_checkpoint_waiting() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        c_requested, c_release = asyncio.Event(), asyncio.Event()
        c_release.set()
        async with asyncio.TaskGroup() as tasks, cut.mutation():
            tasks.create_task(hold_checkpoint(cut, log, "C", c_requested, c_release))
            await c_requested.wait()
            # A checkpoint now blocks new outer mutations; an inner one must pass.
            async with cut.mutation():
                log.append("inner in")
                async with cut.mutation():
                    cut.require_mutation("test(inner-inner)")
                    log.append("inner-inner in")
            log.append("outer out")
        assert log == ["inner in", "inner-inner in", "outer out", "C in", "C out"]

    run(scenario)


def test_the_exclusive_owner_may_mutate_and_reenter_its_section() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        async with cut.checkpoint():
            assert cut.holds_mutation()
            cut.require_mutation("restore(owner, no mutation section)")
            async with cut.mutation():
                cut.require_mutation("restore(owner, in a mutation section)")
                async with cut.mutation():
                    assert cut.holds_mutation()
            async with cut.checkpoint():
                assert cut.holds_mutation()
            assert cut.active_mutations == 0
        assert not cut.holds_mutation()

    run(scenario)


def test_others_wait_while_the_owner_mutates_inside_the_exclusive_section() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        b_requested = asyncio.Event()
        async with asyncio.TaskGroup() as tasks, cut.checkpoint():
            async with cut.mutation():
                tasks.create_task(request_mutation(cut, log, "B", b_requested))
                await b_requested.wait()
                log.append("owner mutated")
            log.append("owner out")
        assert log == ["owner mutated", "owner out", "B in"]

    run(scenario)


def test_checkpoint_inside_a_mutation_raises_instead_of_deadlocking() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        async with cut.mutation():
            with pytest.raises(CheckpointInsideMutationError, match="wait for itself"):
                async with cut.checkpoint():
                    pytest.fail("entered the exclusive section inside a mutation")
            # The failed request left nothing behind: new mutations still pass.
            assert cut.holds_mutation()
        async with cut.checkpoint():
            pass

    run(scenario)


def test_mutation_version_counts_outer_sections_only() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        assert cut.mutation_version == 0
        async with cut.mutation():
            async with cut.mutation(), cut.mutation():
                pass
            assert cut.mutation_version == 0
        assert cut.mutation_version == 1

        a_in, b_in, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        log: list[str] = []
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_mutation(cut, log, "A", a_in, release))
            tasks.create_task(hold_mutation(cut, log, "B", b_in, release))
            await a_in.wait()
            await b_in.wait()
            release.set()
        assert cut.mutation_version == 3

        async with cut.checkpoint():
            pass
        assert cut.mutation_version == 3, "a read-only exclusive section changed nothing"

        async with cut.checkpoint():
            async with cut.mutation(), cut.mutation():
                pass
            async with cut.mutation():
                pass
        assert cut.mutation_version == 5, "each outer mutation section of the owner counts"

    run(scenario)


def test_a_mutation_section_that_raises_still_counts_and_releases() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        with pytest.raises(ValueError, match="boom"):
            async with cut.mutation():
                raise ValueError("boom")
        assert cut.mutation_version == 1
        assert cut.active_mutations == 0
        assert not cut.holds_mutation()
        async with cut.checkpoint():
            pass

    run(scenario)


def test_require_mutation_raises_outside_a_section() -> None:
    cut = DataPlaneMutationCut()
    with pytest.raises(
        MutationCutNotHeldError, match=r"Ledger\.op\(group 'g1'\).*no running event loop"
    ):
        cut.require_mutation("Ledger.op(group 'g1')")

    async def scenario() -> None:
        with pytest.raises(
            MutationCutNotHeldError, match=r"Ledger\.op\(group 'g1'\) must run inside"
        ):
            cut.require_mutation("Ledger.op(group 'g1')")
        assert not cut.holds_mutation()
        async with cut.mutation():
            cut.require_mutation("Ledger.op(group 'g1')")
        with pytest.raises(MutationCutNotHeldError):
            cut.require_mutation("Ledger.op(after the section)")

    run(scenario)


def test_a_section_is_held_per_task_not_per_loop() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        outcome: list[str] = []

        async def other_task() -> None:
            try:
                cut.require_mutation("Ledger.op(other task)")
            except MutationCutNotHeldError:
                outcome.append("refused")

        async with cut.mutation(), asyncio.TaskGroup() as tasks:
            tasks.create_task(other_task())
        assert outcome == ["refused"]

    run(scenario)


def test_a_cancelled_waiting_checkpoint_unblocks_new_mutations() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        a_in, a_release = asyncio.Event(), asyncio.Event()
        c_requested, c_release = asyncio.Event(), asyncio.Event()
        b_requested = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_mutation(cut, log, "A", a_in, a_release))
            await a_in.wait()
            checkpoint = tasks.create_task(hold_checkpoint(cut, log, "C", c_requested, c_release))
            await c_requested.wait()
            blocked = tasks.create_task(request_mutation(cut, log, "B", b_requested))
            await b_requested.wait()
            checkpoint.cancel()
            # B no longer waits behind a checkpoint: it joins A while A is still inside.
            await blocked
            assert log == ["A in", "B in"]
            a_release.set()
        assert checkpoint.cancelled()
        assert log == ["A in", "B in", "A out"]

    run(scenario)


def test_a_second_checkpoint_waits_for_the_first() -> None:
    async def scenario() -> None:
        cut = DataPlaneMutationCut()
        log: list[str] = []
        first_requested, first_release = asyncio.Event(), asyncio.Event()
        second_requested, second_release = asyncio.Event(), asyncio.Event()
        second_release.set()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(hold_checkpoint(cut, log, "C1", first_requested, first_release))
            await first_requested.wait()
            tasks.create_task(hold_checkpoint(cut, log, "C2", second_requested, second_release))
            await second_requested.wait()
            assert log == ["C1 in"]
            first_release.set()
        assert log == ["C1 in", "C1 out", "C2 in", "C2 out"]

    run(scenario)


def test_a_held_section_is_not_held_by_a_worker_thread_nor_outside_the_loop() -> None:
    # The check reads the running task without asyncio.current_task's call: a
    # thread started from inside a held section (to_thread copies the task's
    # context) runs no loop, so it holds nothing, and neither does plain code.
    cut = DataPlaneMutationCut()

    async def scenario() -> None:
        async with cut.mutation():
            assert cut.holds_mutation()
            assert not await asyncio.to_thread(cut.holds_mutation)
            with pytest.raises(MutationCutNotHeldError, match="no running event loop"):
                await asyncio.to_thread(cut.require_mutation, "Ledger.op(thread)")
        assert not cut.holds_mutation()

    run(scenario)
    assert not cut.holds_mutation()
