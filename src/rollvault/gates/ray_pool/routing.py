"""Sticky least-loaded routing: which actor an attempt goes to.

A group's siblings go to the actor that took the group's first sibling while
it stays healthy (sticky: the siblings batch together and share a weight
version, as the local model gate keeps them); a new group, or one whose
actor is no longer healthy, goes to the healthy actor with the least work
queued and running (ties: the lowest index).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

__all__ = ["StickyRouter"]

_MAX_STICKY_GROUPS: Final = 65536
"""Groups remembered; the oldest are forgotten first (they have long finished)."""


class StickyRouter:
    """Remembers which actor each recent group went to."""

    def __init__(self) -> None:
        self._actor_of: OrderedDict[str, int] = OrderedDict()

    def route(self, group_id: str, loads: Sequence[int | None]) -> int | None:
        """The actor index for ``group_id``; ``loads[i]`` is None for an actor that is not
        healthy. None: no actor is healthy."""
        sticky = self._actor_of.get(group_id)
        if sticky is not None and loads[sticky] is not None:
            self._actor_of.move_to_end(group_id)
            return sticky
        healthy = [(load, index) for index, load in enumerate(loads) if load is not None]
        if not healthy:
            return None
        chosen = min(healthy)[1]
        self._actor_of[group_id] = chosen
        self._actor_of.move_to_end(group_id)
        while len(self._actor_of) > _MAX_STICKY_GROUPS:
            self._actor_of.popitem(last=False)
        return chosen
