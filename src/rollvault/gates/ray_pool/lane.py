"""One generation actor as the pool sees it: its handle, health, queue and dispatcher.

A lane's dispatcher brings its actor up (``RESTARTING`` -> ``STALE`` once the
model is loaded -> ``HEALTHY`` once it holds the current weight version),
then sends it batches of the requests routed to it, batched as the local
model gate batches (whole groups, the weight hold while a group is split).
When the actor dies mid-batch, the batch's attempts fail as lost (the gate
turns that into ``FailureKind.INFRA``: the rollout pump retries them, on
another actor), the requests still queued are handed back to the pool to
route elsewhere, and the lane waits for Ray to restart the actor; after
``max_actor_restarts`` restarts it stays ``DEAD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from rollvault.config.schema import LocalModelGateConfig, RayGateConfig
from rollvault.gates.group_batches import GroupBatchQueue, fail_request
from rollvault.gates.ray_pool.health import ActorHealth, check_transition
from rollvault.gates.ray_pool.weights import WeightBroadcast
from rollvault.gates.worker_process import WorkerLostError, WorkerStartError
from rollvault.gates.worker_protocol import (
    Generate,
    Generated,
    GenerationRequest,
    GenerationResult,
    Ready,
    WeightsLoaded,
    WorkerFailed,
    decode_reply,
    encode,
)

__all__ = ["ActorLane", "LaneResult", "PendingRequest"]

_RESTART_POLL_S: Final = 0.2

LaneResult = tuple[int, GenerationResult, str]
"""Weight version that generated it, the result, and the actor's name."""


class PendingRequest(msgspec.Struct):
    """A request waiting in a lane (or being re-routed after its lane died)."""

    group_id: str
    request: GenerationRequest
    future: asyncio.Future[LaneResult]


class _ActorLost(Exception):
    """The actor died, timed out, or failed a command: the lane must recover."""

    def __init__(self, message: str, *, died: bool = False, unavailable: bool = False) -> None:
        super().__init__(message)
        self.died = died
        """Ray reported the actor dead (it restarts it); False: alive but failing."""
        self.unavailable = unavailable
        """Ray reported it unreachable for now (restarting, or its node is slow)."""


class ActorLane:
    """One generation actor and its dispatcher (see the module docstring)."""

    def __init__(
        self,
        index: int,
        handle: Any,
        *,
        sampling: LocalModelGateConfig,
        pool: RayGateConfig,
        weights: WeightBroadcast,
        on_change: Callable[[], None],
        reroute: Callable[[list[PendingRequest]], None],
    ) -> None:
        self.index = index
        self.name = f"generation-actor-{index}"
        self.handle = handle
        self.health = ActorHealth.RESTARTING
        self.pid: int | None = None
        self.weight_version: int | None = None
        self.restarts = 0
        self.batches = 0
        self.largest_batch = 0
        self.fatal: WorkerStartError | None = None
        """The actor cannot load the model: restarting it would not help."""
        self.losses: list[str] = []
        """Why the actor was lost, each time (the newest last)."""
        self.given_up: str | None = None
        """Why the lane gave its actor up (lost more than max_actor_restarts times)."""
        self._sampling = sampling
        self._pool = pool
        self._weights = weights
        self._on_change = on_change
        self._reroute = reroute
        self._pending: GroupBatchQueue[PendingRequest] = GroupBatchQueue(sampling.max_batch_size)
        self._running = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what the pool asks -------------------------------------------------------------

    @property
    def load(self) -> int | None:
        """Requests queued and running, or None when the lane takes no work."""
        if self.health is not ActorHealth.HEALTHY:
            return None
        return len(self._pending) + self._running

    @property
    def running(self) -> int:
        """Requests of the batch the actor is generating now (0: between batches)."""
        return self._running

    @property
    def gone(self) -> bool:
        """Never to take work again: given up, or unable to load the model."""
        return self.fatal is not None or self.given_up is not None

    def start(self) -> None:
        """Start the dispatcher (it brings the actor up first). Idempotent."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    def submit(self, pending: PendingRequest) -> None:
        self._pending.append(pending)
        self._wakeup.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pending.cancel_all()

    # -- the dispatcher -----------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._bring_up()
                await self._serve()
            except _ActorLost as lost:
                if not self._recover(lost):
                    self._on_change()
                    return
            except WorkerStartError as error:
                self.fatal = error
                self._fail_queued(error)
                self._on_change()
                return
            except Exception as error:
                # A bug, not a lost actor: every attempt waiting here and every later one
                # fails with it (the run stops with this message) instead of hanging.
                self.fatal = WorkerStartError(f"{self.name}: dispatcher failed: {error!r}")
                self._fail_queued(self.fatal)
                self._on_change()
                raise

    def _transition(self, new: ActorHealth) -> None:
        self.health = check_transition(self.name, self.health, new)
        if new is ActorHealth.HEALTHY:
            self._on_change()

    async def _bring_up(self) -> None:
        """RESTARTING -> STALE (model loaded) -> HEALTHY (current weights loaded)."""
        reply = decode_reply(await self._ready_reply())
        if isinstance(reply, WorkerFailed):
            raise WorkerStartError(f"{self.name}: {reply.message}")
        if not isinstance(reply, Ready):
            raise _ActorLost(f"{self.name} sent {type(reply).__name__} before ready")
        self.pid = reply.pid
        self.weight_version = None
        self._transition(ActorHealth.STALE)
        await self._load_current_weights()
        self._transition(ActorHealth.HEALTHY)

    async def _serve(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch, hold = self._pending.next_batch()
                if batch:
                    await self._run_batch(batch, hold=hold)

    async def _run_batch(self, batch: list[PendingRequest], *, hold: bool) -> None:
        self._running = len(batch)
        try:
            if self.weight_version != self._weights.version and not hold:
                await self._load_current_weights()
            command = Generate(
                requests=[pending.request for pending in batch],
                max_new_tokens=self._sampling.max_new_tokens,
            )
            reply = decode_reply(await self._call(self.handle.generate.remote(encode(command))))
            if not isinstance(reply, Generated) or reply.weight_version is None:
                raise _ActorLost(f"{self.name} answered a batch with {_describe(reply)}")
        except _ActorLost as lost:
            error = WorkerLostError(str(lost))
            for pending in batch:
                fail_request(pending, error)
            raise
        except Exception as unexpected:
            for pending in batch:
                fail_request(pending, unexpected)
            raise
        finally:
            self._running = 0
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        for pending, result in zip(batch, reply.results, strict=True):
            if not pending.future.done():
                pending.future.set_result((reply.weight_version, result, self.name))

    async def _load_current_weights(self) -> None:
        version = self._weights.version
        reply = decode_reply(
            await self._call(self.handle.load_weights.remote(version, self._weights.ref))
        )
        if not isinstance(reply, WeightsLoaded) or reply.version != version:
            raise _ActorLost(
                f"{self.name} answered load_weights({version}) with {_describe(reply)}"
            )
        self.weight_version = version

    async def _ready_reply(self) -> bytes:
        """The actor's ``ready`` reply, waiting out a restart in progress."""
        deadline = time.monotonic() + self._pool.actor_call_timeout_s
        while True:
            try:
                return await self._call(self.handle.ready.remote())
            except _ActorLost as lost:
                # Ray answers calls to an actor it is restarting with "unavailable".
                if not lost.unavailable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(_RESTART_POLL_S)

    async def _call(self, ref: Any) -> bytes:
        """Await one actor call; a dead, restarting or silent actor is :class:`_ActorLost`."""
        try:
            reply = await asyncio.wait_for(ref, self._pool.actor_call_timeout_s)
        except ActorUnavailableError as error:
            raise _ActorLost(
                f"{self.name} (pid {self.pid}) is unavailable: {error!r}",
                died=True,
                unavailable=True,
            ) from error
        except RayActorError as error:
            raise _ActorLost(f"{self.name} (pid {self.pid}) died: {error!r}", died=True) from error
        except (RayError, TimeoutError, GetTimeoutError) as error:
            raise _ActorLost(f"{self.name} (pid {self.pid}) is lost: {error!r}") from error
        if not isinstance(reply, bytes):
            raise _ActorLost(f"{self.name} replied with {type(reply).__name__}, not bytes")
        return reply

    # -- recovery -----------------------------------------------------------------------

    def _recover(self, lost: _ActorLost) -> bool:
        """After a loss: DEAD, queued work re-routed; True if the actor is being restarted."""
        reason = str(lost)
        self.losses.append(reason)
        if self.health is ActorHealth.HEALTHY and not lost.died:
            # A live actor that failed a command or went silent: suspect, then replaced.
            self._transition(ActorHealth.SUSPECT)
        self._transition(ActorHealth.DEAD)
        self._reroute(self._pending.take_all())
        if self.restarts >= self._pool.max_actor_restarts:
            self._give_up(reason)
            return False
        self.restarts += 1
        if not lost.died:
            # Alive but failing or hung: kill it so Ray restarts it (a dead one Ray
            # restarts by itself; killing it again would kill its replacement).
            with contextlib.suppress(RayError):
                ray.kill(self.handle, no_restart=False)
        self._transition(ActorHealth.RESTARTING)
        return True

    def _give_up(self, reason: str) -> None:
        with contextlib.suppress(RayError):
            ray.kill(self.handle, no_restart=True)
        self.given_up = (
            f"{self.name} was lost {self.restarts + 1} times (gate.ray.max_actor_restarts="
            f"{self._pool.max_actor_restarts}); last: {reason}"
        )

    def _fail_queued(self, error: Exception) -> None:
        self._pending.fail_all(error)


def _describe(reply: object) -> str:
    if isinstance(reply, WorkerFailed):
        return f"a failure: {reply.message}"
    return type(reply).__name__
