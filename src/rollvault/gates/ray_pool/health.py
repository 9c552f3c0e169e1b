"""The health of one generation actor: an explicit state, its legal transitions in one place.

Only a ``HEALTHY`` actor is given attempts. An actor starts (and restarts)
as ``RESTARTING``; once its process is up and its model is loaded it is
``STALE`` until it has loaded the current weight version, and only then
``HEALTHY``. A command that failed inside a live actor makes it
``SUSPECT`` (it gets no new work until a command succeeds again); a lost
actor is ``DEAD`` until Ray restarts it, or for good once Ray gives up.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["ActorHealth", "HealthTransitionError", "check_transition"]


class ActorHealth(enum.StrEnum):
    """Where one generation actor stands (see the module docstring)."""

    RESTARTING = "restarting"
    STALE = "stale"
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DEAD = "dead"


class HealthTransitionError(RuntimeError):
    """A transition the state machine does not allow (a bug in the pool, never bad luck)."""


_ALLOWED: Final[dict[ActorHealth, frozenset[ActorHealth]]] = {
    ActorHealth.RESTARTING: frozenset({ActorHealth.STALE, ActorHealth.DEAD}),
    ActorHealth.STALE: frozenset({ActorHealth.HEALTHY, ActorHealth.DEAD}),
    ActorHealth.HEALTHY: frozenset({ActorHealth.SUSPECT, ActorHealth.DEAD}),
    ActorHealth.SUSPECT: frozenset({ActorHealth.HEALTHY, ActorHealth.DEAD}),
    ActorHealth.DEAD: frozenset({ActorHealth.RESTARTING}),
}


def check_transition(actor: str, current: ActorHealth, new: ActorHealth) -> ActorHealth:
    """Return ``new`` if ``current -> new`` is allowed, else raise naming ``actor``."""
    if new not in _ALLOWED[current]:
        allowed = ", ".join(sorted(state.value for state in _ALLOWED[current]))
        raise HealthTransitionError(
            f"generation actor {actor}: cannot go from {current.value} to {new.value} "
            f"(allowed: {allowed})"
        )
    return new
