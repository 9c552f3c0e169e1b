"""An asyncio barrier between state mutations and checkpoint capture.

Every change to rollout state (a ledger transition, a data-plane put or clear,
a dataloader advance together with its prompt reservation) runs inside a
*mutation section*. A checkpoint captures that state inside an *exclusive
section*, which waits until running mutations drain and blocks new ones, so
the capture sees either all of a mutation or none of it.

Any number of mutation sections may run at once. Sections are reentrant per
task: a task already inside a mutation (or inside the exclusive section it
holds) may open another without waiting, which is what lets a mutation call a
helper that mutates too. A waiting checkpoint blocks *new* outer mutations, so
a steady stream of short mutations cannot starve it.

``mutation_version`` increases when an outer mutation section ends, so a
periodic checkpointer can skip a snapshot when nothing changed. That includes
a mutation section opened by the holder of the exclusive section (restore
changes state that way); the exclusive section itself does not count.
"""

from __future__ import annotations

import asyncio
import asyncio.tasks
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

_get_running_loop = asyncio.events._get_running_loop
_CurrentTasks = dict[asyncio.AbstractEventLoop, "asyncio.Task[object]"]


def _current_tasks_map() -> _CurrentTasks | None:
    """The running task of each running loop, where reading it is faster than asking.

    On CPython 3.11 ``asyncio.current_task`` is a Python function that looks the
    running loop up in this dict (kept by the C task implementation); the ledger
    checks the cut on every call, and the function call is most of that check's
    cost. Where ``current_task`` is itself built in (3.12 and later) or the dict is
    gone, None: the check then calls ``current_task``.
    """
    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    if isinstance(asyncio.current_task, types.BuiltinFunctionType) or type(tasks) is not dict:
        return None
    return tasks


_CURRENT_TASKS = _current_tasks_map()


class MutationCutNotHeldError(RuntimeError):
    """A mutator was called outside a mutation section of its cut."""


class CheckpointInsideMutationError(RuntimeError):
    """A task that holds a mutation section asked for the exclusive section.

    Waiting would deadlock: the exclusive section waits for that very task.
    """


def _current_task(operation: str) -> asyncio.Task[object]:
    try:
        task = asyncio.current_task()
    except RuntimeError as exc:
        raise MutationCutNotHeldError(
            f"{operation}: no running event loop; mutations must run inside a "
            "DataPlaneMutationCut section on the controller's event loop"
        ) from exc
    if task is None:
        raise MutationCutNotHeldError(f"{operation}: not called from an asyncio task")
    return task


class DataPlaneMutationCut:
    """Many concurrent mutation sections, or one exclusive checkpoint section.

    Owned by the controller; created on its event loop and shared by the
    ledger, the data plane and the sampler.
    """

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._mutation_depth: dict[asyncio.Task[object], int] = {}
        self._exclusive_owner: asyncio.Task[object] | None = None
        self._exclusive_depth = 0
        self._owner_mutation_depth = 0
        self._checkpoints_waiting = 0
        self._mutation_version = 0

    @property
    def mutation_version(self) -> int:
        """Number of outer mutation sections completed so far."""
        return self._mutation_version

    @property
    def active_mutations(self) -> int:
        """Number of tasks currently inside a mutation section."""
        return len(self._mutation_depth)

    def holds_mutation(self) -> bool:
        """Whether the current task may mutate: inside a mutation or the exclusive section."""
        loop = _get_running_loop()
        if loop is None:
            return False
        # What current_task(loop) returns, without its call where that is faster.
        task = asyncio.current_task(loop) if _CURRENT_TASKS is None else _CURRENT_TASKS.get(loop)
        return task is not None and (task in self._mutation_depth or task is self._exclusive_owner)

    def require_mutation(self, operation: str) -> None:
        """Raise :class:`MutationCutNotHeldError` unless the caller may mutate.

        ``operation`` names the mutator in the error, for example
        ``"RolloutRecoveryLedger.mark_group_dispatched(group 'g7')"``.
        """
        task = _current_task(operation)
        if task not in self._mutation_depth and task is not self._exclusive_owner:
            raise MutationCutNotHeldError(
                f"{operation} must run inside `async with cut.mutation():` "
                "(or the exclusive checkpoint section) of the DataPlaneMutationCut "
                "passed to it; the current task holds neither"
            )

    @asynccontextmanager
    async def mutation(self) -> AsyncIterator[None]:
        """Enter a mutation section; reentrant for the task that holds one."""
        task = _current_task("DataPlaneMutationCut.mutation()")
        if task is self._exclusive_owner:
            # The checkpoint holder (for example restore) mutates without waiting,
            # and its outer mutation section counts like any other.
            self._owner_mutation_depth += 1
            try:
                yield
            finally:
                self._owner_mutation_depth -= 1
                if not self._owner_mutation_depth:
                    self._mutation_version += 1
            return
        depth = self._mutation_depth.get(task, 0)
        if depth:
            self._mutation_depth[task] = depth + 1
            try:
                yield
            finally:
                self._mutation_depth[task] -= 1
            return
        async with self._condition:
            await self._condition.wait_for(
                lambda: self._exclusive_owner is None and self._checkpoints_waiting == 0
            )
            self._mutation_depth[task] = 1
        try:
            yield
        finally:
            del self._mutation_depth[task]
            self._mutation_version += 1
            if not self._mutation_depth:
                await self._notify_all()

    @asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        """Enter the exclusive section: wait for mutations to drain, block new ones."""
        task = _current_task("DataPlaneMutationCut.checkpoint()")
        if task in self._mutation_depth:
            raise CheckpointInsideMutationError(
                "DataPlaneMutationCut.checkpoint() called by a task inside a mutation "
                "section; it would wait for itself forever"
            )
        if task is self._exclusive_owner:
            self._exclusive_depth += 1
            try:
                yield
            finally:
                self._exclusive_depth -= 1
            return
        async with self._condition:
            self._checkpoints_waiting += 1
            try:
                await self._condition.wait_for(
                    lambda: self._exclusive_owner is None and not self._mutation_depth
                )
            finally:
                self._checkpoints_waiting -= 1
                # A cancelled waiter may have been the only thing blocking mutations.
                self._condition.notify_all()
            self._exclusive_owner = task
            self._exclusive_depth = 1
        try:
            yield
        finally:
            self._exclusive_owner = None
            self._exclusive_depth = 0
            await self._notify_all()

    async def _notify_all(self) -> None:
        async with self._condition:
            self._condition.notify_all()
