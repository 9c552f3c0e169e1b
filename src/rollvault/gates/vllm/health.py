"""Fleet health: which inference servers may take attempts, as one explicit state machine.

NeMo RL's idea, per server::

    HEALTHY ──failure──► SUSPECT ──failure──► DEAD ──restart──► RESTARTING ──up──► STALE
       ▲                   │ success                                              │
       └───────────────────┘◄──────────────────── refit to the current version ───┘

Only a HEALTHY server gets attempts. A SUSPECT one (one infra failure) gets
none until a health check clears it; a second failure makes it DEAD. A DEAD
server is restarted (a managed one) or probed until it answers again (an
external one); it comes back STALE, holding whatever weights it loaded at
start-up, and gets work only once it has loaded the current weight version.
A weight sync also makes every server STALE until it confirms the new version.

Every transition is listed in :data:`TRANSITIONS`, and :meth:`FleetHealth.move`
is the one place that changes a state: a move the table does not allow raises
:class:`ServerStateError` naming the server, its state and the move.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["TRANSITIONS", "FleetHealth", "HealthEvent", "ServerHealth", "ServerStateError"]


class ServerHealth(enum.StrEnum):
    """Where one server is in its life (see the module docstring)."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DEAD = "dead"
    RESTARTING = "restarting"
    STALE = "stale"


class HealthEvent(enum.StrEnum):
    """What happened to a server."""

    FAILED = "failed"
    """An infra failure: connection refused or reset, 5xx, timeout."""
    CHECKED_OK = "checked_ok"
    """A health check or a request succeeded."""
    RESTARTING = "restarting"
    """A restart (managed) or a reconnection probe (external) began."""
    UP = "up"
    """The restarted server answers ``/health``; its weights are not yet known."""
    NEW_VERSION = "new_version"
    """The fleet moves to a new weight version: the server must load it."""
    REFITTED = "refitted"
    """The server confirmed (``/weight_info``) that it holds the current version."""


_S = ServerHealth
_E = HealthEvent

TRANSITIONS: Final[Mapping[tuple[ServerHealth, HealthEvent], ServerHealth]] = MappingProxyType(
    {
        (_S.HEALTHY, _E.FAILED): _S.SUSPECT,
        (_S.HEALTHY, _E.CHECKED_OK): _S.HEALTHY,
        (_S.HEALTHY, _E.NEW_VERSION): _S.STALE,
        (_S.SUSPECT, _E.FAILED): _S.DEAD,
        (_S.SUSPECT, _E.CHECKED_OK): _S.HEALTHY,
        # A suspect server must load the new version too; a failed refit then kills it.
        (_S.SUSPECT, _E.NEW_VERSION): _S.STALE,
        (_S.DEAD, _E.FAILED): _S.DEAD,
        (_S.DEAD, _E.NEW_VERSION): _S.DEAD,
        (_S.DEAD, _E.RESTARTING): _S.RESTARTING,
        (_S.RESTARTING, _E.FAILED): _S.DEAD,
        (_S.RESTARTING, _E.NEW_VERSION): _S.RESTARTING,
        (_S.RESTARTING, _E.UP): _S.STALE,
        (_S.STALE, _E.FAILED): _S.DEAD,
        (_S.STALE, _E.NEW_VERSION): _S.STALE,
        (_S.STALE, _E.REFITTED): _S.HEALTHY,
    }
)
"""Every allowed ``(state, event) -> state``; anything else is a bug and raises."""


class ServerStateError(RuntimeError):
    """A server was moved in a way :data:`TRANSITIONS` does not allow."""

    def __init__(self, server: str, state: ServerHealth, event: HealthEvent) -> None:
        super().__init__(
            f"inference server {server} is {state.value}: it cannot take event {event.value}"
        )
        self.server = server
        self.state = state
        self.event = event


class FleetHealth:
    """The health of each server of a fleet, by name (its URL)."""

    def __init__(self, servers: Iterable[str], *, initial: ServerHealth = _S.STALE) -> None:
        # A server starts STALE: it answers, but has not loaded the run's weights.
        self._states = dict.fromkeys(servers, initial)
        if not self._states:
            raise ValueError("FleetHealth needs at least one server")
        self.history: list[tuple[str, ServerHealth, HealthEvent, ServerHealth]] = []
        """Every transition made, in order: (server, from, event, to)."""

    def state(self, server: str) -> ServerHealth:
        try:
            return self._states[server]
        except KeyError:
            raise KeyError(f"no inference server {server} in this fleet") from None

    def move(self, server: str, event: HealthEvent) -> ServerHealth:
        """Apply ``event`` to ``server``; raise :class:`ServerStateError` if not allowed."""
        before = self.state(server)
        after = TRANSITIONS.get((before, event))
        if after is None:
            raise ServerStateError(server, before, event)
        self._states[server] = after
        if after is not before:
            self.history.append((server, before, event, after))
        return after

    def in_state(self, state: ServerHealth) -> list[str]:
        """The servers in ``state``, in fleet order."""
        return [server for server, current in self._states.items() if current is state]

    @property
    def servers(self) -> list[str]:
        return list(self._states)

    def snapshot(self) -> dict[str, ServerHealth]:
        """Every server's state (a copy)."""
        return dict(self._states)
