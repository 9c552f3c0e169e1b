"""Pausing the cyclic garbage collector while a snapshot is read or restored.

Reading a snapshot of 1,024 groups x 16 siblings decodes and builds a few
hundred thousand long-lived objects (records, rows, their metadata) and no
garbage cycles. Each allocation burst triggers collections that walk
everything built so far; measured, they cost more than the decoding and
restoring itself (``BENCHMARKS.md``, "Fast restore and ledger (issue 16)").
Reference counting still frees every temporary while the collector is
paused, and it runs again afterwards.

A block that ends normally also *freezes* what is alive then (``gc.freeze``):
what a read or a restore built is the run's state and lives as long as the
run, and without the freeze the first collection after the pause walks all
of it once (~30 ms at 16k attempts, since none of it has been through a
collection yet) and every full collection of the run walks it again. The
price is that a garbage cycle alive at that moment is never collected;
measured, there are next to none (4 objects at the first restore of a
process, then 0), since reference counting has freed every temporary.
Reference counting still frees frozen objects. A block that raises is not
frozen: its traceback may hold a cycle over what it built.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The block runs with the cyclic collector off (as it was before, afterwards);
    what is alive when it ends normally is frozen (see above)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    except BaseException:
        if was_enabled:
            gc.enable()
        raise
    if was_enabled:
        gc.freeze()
        gc.enable()


def gc_paused_async(
    method: Callable[_P, Coroutine[Any, Any, _R]],
) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """Decorate a coroutine function to run with the cyclic collector paused."""

    @functools.wraps(method)
    async def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with cyclic_gc_paused():
            return await method(*args, **kwargs)

    return paused
