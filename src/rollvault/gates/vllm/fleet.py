"""The servers of a vLLM gate: routing, weight refits, failure handling and restarts.

Each server is a :class:`Server`: its client, its process when the gate
manages it, and an incarnation number that a restart increments, so a late
failure report of a request sent to the server's previous life cannot mark
its new life dead. Health lives in one :class:`~rollvault.gates.vllm.health.FleetHealth`.

Routing (:meth:`Fleet.acquire`) is sticky least-loaded: the siblings of a
group go to the server the group went to first (its prompt is then in that
server's prefix cache), while that server is healthy; otherwise to the
healthy server with the fewest requests in flight. With no healthy server it
waits until one is (a restart and refit in progress), and raises
:class:`FleetDownError` when none can come back.

A refit brings a server to the fleet's current weight version: pause
(``wait``), ``reload_weights`` from the version's directory, set the version,
resume, and read ``/weight_info`` back; only a server whose answer is the
current version becomes healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from rollvault.gates.vllm.client import ServerDataError, ServerInfraError, VllmClient
from rollvault.gates.vllm.health import FleetHealth, HealthEvent, ServerHealth
from rollvault.gates.vllm.launch import ManagedServer

__all__ = ["Fleet", "FleetDownError", "Server", "WeightSyncError"]

_POLL_S = 0.5
_STICKY_GROUPS = 4096
"""Groups whose server is remembered (the oldest are forgotten first)."""


class FleetDownError(RuntimeError):
    """No server is healthy and none can become healthy again: the run cannot generate."""


class WeightSyncError(RuntimeError):
    """A server refused the weights (4xx, or ``/weight_info`` disagrees): not transient."""


@dataclass
class Server:
    """One server of the fleet."""

    client: VllmClient
    managed: ManagedServer | None = None
    stop_on_close: bool = True
    """Whether closing the fleet stops a managed server (False: someone else owns it)."""
    incarnation: int = 0
    inflight: int = 0
    restarts_in_a_row: int = 0
    restarts: int = 0
    recovery: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.client.url


class Fleet:
    """The gate's servers and their health (see the module docstring)."""

    def __init__(
        self,
        servers: list[Server],
        *,
        startup_timeout_s: float,
        max_restarts: int,
    ) -> None:
        self.servers = servers
        self.health = FleetHealth([s.name for s in servers], initial=ServerHealth.DEAD)
        self._startup_timeout_s = startup_timeout_s
        self._max_restarts = max_restarts
        self._changed = asyncio.Event()
        self._sticky: OrderedDict[str, Server] = OrderedDict()
        self._weights: tuple[int, Path] | None = None
        self._weights_lock = asyncio.Lock()
        """Held while a refit reads the current version: a sync cannot change it meanwhile."""
        self.fatal: WeightSyncError | None = None
        """A server refused the weights while recovering: every later acquire raises it."""
        self.refits = 0
        self.sync_seconds = 0.0
        """Wall time spent bringing servers to new versions (pause to resume)."""

    # -- start and stop -------------------------------------------------------------------

    def bring_up(self, version: int, weights_dir: Path) -> None:
        """Record the current weights and start bringing every server up (in the background)."""
        self._weights = (version, weights_dir)
        for server in self.servers:
            self._start_recovery(server)

    async def close(self) -> None:
        for server in self.servers:
            if server.recovery is not None:
                server.recovery.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await server.recovery
            await server.client.close()
            if server.managed is not None and server.stop_on_close:
                await asyncio.to_thread(server.managed.stop)

    # -- routing --------------------------------------------------------------------------

    async def acquire(self, group_id: str, *, timeout_s: float) -> Server:
        """A healthy server for ``group_id`` (sticky, else least loaded), with its load counted."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.fatal is not None:
                raise self.fatal
            server = self._choose(group_id)
            if server is not None:
                server.inflight += 1
                return server
            if not any(s.recovery is not None and not s.recovery.done() for s in self.servers):
                states = ", ".join(f"{n}: {h.value}" for n, h in self.health.snapshot().items())
                raise FleetDownError(f"no vLLM server is healthy or coming back ({states})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no vLLM server became healthy within {timeout_s} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, _POLL_S))

    def release(self, server: Server) -> None:
        server.inflight -= 1
        self._notify()

    def _choose(self, group_id: str) -> Server | None:
        healthy = set(self.health.in_state(ServerHealth.HEALTHY))
        sticky = self._sticky.get(group_id)
        if sticky is not None and sticky.name in healthy:
            self._sticky.move_to_end(group_id)
            return sticky
        candidates = [s for s in self.servers if s.name in healthy]
        if not candidates:
            return None
        chosen = min(candidates, key=lambda s: s.inflight)
        self._sticky[group_id] = chosen
        while len(self._sticky) > _STICKY_GROUPS:
            self._sticky.popitem(last=False)
        return chosen

    def total_inflight(self) -> int:
        return sum(s.inflight for s in self.servers)

    async def drained(self) -> None:
        """Wait until no request is in flight on any server."""
        while self.total_inflight() > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=_POLL_S)

    # -- failures -------------------------------------------------------------------------

    def report_failure(self, server: Server, incarnation: int) -> None:
        """An infra failure of a request sent to ``server`` in ``incarnation``."""
        if incarnation != server.incarnation:
            return  # the server has been restarted since: this was its previous life
        state = self.health.state(server.name)
        if state not in (ServerHealth.HEALTHY, ServerHealth.SUSPECT):
            return  # already known to be down and being dealt with
        if server.managed is not None and not server.managed.alive():
            self.health.move(server.name, HealthEvent.FAILED)  # a dead process: straight to DEAD
        after = self.health.move(server.name, HealthEvent.FAILED)
        if after is ServerHealth.DEAD:
            self._start_recovery(server)
        elif server.recovery is None or server.recovery.done():
            server.recovery = asyncio.create_task(self._check(server), name=f"check {server.name}")
        self._notify()

    def report_success(self, server: Server) -> None:
        server.restarts_in_a_row = 0

    async def _check(self, server: Server) -> None:
        """A suspect server: healthy again if ``/health`` answers, else dead and recovered."""
        ok = await server.client.healthy()
        if server.managed is not None and not server.managed.alive():
            ok = False
        if self.health.state(server.name) is ServerHealth.SUSPECT:
            if ok:
                self.health.move(server.name, HealthEvent.CHECKED_OK)
                self._notify()
                return
            self.health.move(server.name, HealthEvent.FAILED)
        # Dead, by this check or by a failure reported while it ran (whose recovery
        # could not start while this task held the slot): recover it now.
        if self.health.state(server.name) is ServerHealth.DEAD:
            server.recovery = None
            self._start_recovery(server)
        self._notify()

    def _start_recovery(self, server: Server) -> None:
        if server.recovery is not None and not server.recovery.done():
            return
        if server.restarts_in_a_row > self._max_restarts:
            return  # it stays dead
        server.recovery = asyncio.create_task(self._recover(server), name=f"recover {server.name}")

    async def _recover(self, server: Server) -> None:
        """DEAD -> RESTARTING -> STALE -> HEALTHY: restart (or probe), wait for health, refit."""
        try:
            await self._restart_and_refit(server)
        except ServerInfraError:
            if self.health.state(server.name) is not ServerHealth.DEAD:
                self.health.move(server.name, HealthEvent.FAILED)
            server.recovery = None
            self._start_recovery(server)
        except WeightSyncError as error:
            self.fatal = error
        finally:
            self._notify()

    async def _restart_and_refit(self, server: Server) -> None:
        self.health.move(server.name, HealthEvent.RESTARTING)
        server.incarnation += 1
        server.restarts_in_a_row += 1
        managed = server.managed
        if managed is not None:
            if not managed.alive() or server.incarnation > 1:
                await asyncio.to_thread(managed.stop)
                managed.start()  # on the loop thread: PDEATHSIG follows the thread that forks
            if server.incarnation > 1:
                server.restarts += 1
        await self.wait_healthy(server)
        await self._check_model(server)
        self.health.move(server.name, HealthEvent.UP)
        async with self._weights_lock:
            await self._refit(server)

    async def wait_healthy(self, server: Server) -> None:
        """Poll ``/health`` until it answers; ServerInfraError if the process exits or the
        start-up timeout passes."""
        deadline = time.monotonic() + self._startup_timeout_s
        while not await server.client.healthy():
            managed = server.managed
            if managed is not None and (message := managed.exit_message()) is not None:
                raise ServerInfraError(f"vLLM server {server.name} {message}")
            if time.monotonic() > deadline:
                raise ServerInfraError(
                    f"vLLM server {server.name} did not answer /health within "
                    f"{self._startup_timeout_s} s"
                )
            await asyncio.sleep(_POLL_S)

    async def _check_model(self, server: Server) -> None:
        """Refuse a server that does not serve the gate's model (every request would 404)."""
        try:
            served = await server.client.served_models()
        except ServerDataError as error:
            raise WeightSyncError(f"vLLM server {server.name}: {error}") from error
        if server.client.model not in served:
            raise WeightSyncError(
                f"vLLM server {server.name} serves {served}, not {server.client.model!r} "
                "(start it with --model at model.path's absolute path)"
            )

    # -- weights --------------------------------------------------------------------------

    async def sync(self, version: int, weights_dir: Path) -> None:
        """Make ``version`` current and refit every server that can take it.

        The caller has drained the fleet (no request in flight). Servers that fail
        to refit are marked dead and restarted; restarted servers refit to the
        current version before they take work.
        """
        async with self._weights_lock:
            self._weights = (version, weights_dir)
            for server in self.servers:
                self.health.move(server.name, HealthEvent.NEW_VERSION)
            stale = [s for s in self.servers if self.health.state(s.name) is ServerHealth.STALE]
            started = time.monotonic()
            results = await asyncio.gather(
                *(self._refit(server) for server in stale), return_exceptions=True
            )
            self.sync_seconds += time.monotonic() - started
        for server, result in zip(stale, results, strict=True):
            if isinstance(result, ServerInfraError):
                self.health.move(server.name, HealthEvent.FAILED)  # STALE -> DEAD
                self._start_recovery(server)
            elif isinstance(result, BaseException):
                raise result
        self._notify()

    async def _refit(self, server: Server) -> None:
        """Load the current version on a STALE server; HEALTHY once ``/weight_info`` agrees."""
        assert self._weights is not None, "bring_up() sets the weights first"
        version, weights_dir = self._weights
        client = server.client
        try:
            await client.pause("wait")
            await client.reload_weights(str(weights_dir))
            await client.set_weight_version(str(version))
            await client.resume()
            reported = await client.weight_version()
        except ServerDataError as error:
            raise WeightSyncError(
                f"vLLM server {server.name} refused version {version}: {error}"
            ) from error
        if reported != str(version):
            raise WeightSyncError(
                f"vLLM server {server.name} reports weight version {reported!r} after loading "
                f"version {version} from {weights_dir}"
            )
        self.refits += 1
        self.health.move(server.name, HealthEvent.REFITTED)

    def _notify(self) -> None:
        self._changed.set()
