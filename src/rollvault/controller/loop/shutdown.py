"""A request to stop a run early (preemption), made once, and when it was made.

SLURM, Kubernetes and spot-instance reclaim stop a job with SIGTERM and, a
grace period later, SIGKILL. The command line turns the first SIGTERM or
SIGINT into :meth:`Shutdown.request`; tests call it directly. The pipeline
(:func:`rollvault.controller.loop.pipeline.run_pipeline`) owns what happens
next: it stops dispatching, writes a final rollout snapshot within
``rollout_checkpointing.shutdown_grace_s`` of the request, and returns a
summary saying where a restart resumes.
"""

from __future__ import annotations

import asyncio
import signal

__all__ = ["Shutdown"]


class Shutdown:
    """A one-time request to stop the run, with the signal that asked and its loop time.

    Create and use it on the event loop that runs the pipeline. Only the
    first request counts: a later one changes nothing (what a second signal
    does is the caller's business; ``rollvault run`` exits at once).
    """

    def __init__(self) -> None:
        self._requested = asyncio.Event()
        self._signal: signal.Signals | None = None
        self._requested_at: float | None = None

    def request(self, signum: signal.Signals) -> bool:
        """Ask the run to stop because of ``signum``; True for the first request, else False."""
        if self._signal is not None:
            return False
        self._signal = signum
        self._requested_at = asyncio.get_running_loop().time()
        self._requested.set()
        return True

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._signal is not None

    @property
    def signal(self) -> signal.Signals | None:
        """The signal of the first request (None: no request yet)."""
        return self._signal

    async def wait(self) -> None:
        """Return once a stop is requested."""
        await self._requested.wait()

    def deadline(self, grace_s: float) -> float:
        """The loop time ``grace_s`` seconds after the request; raises if there was none."""
        if self._requested_at is None:
            raise RuntimeError("Shutdown.deadline: no stop was requested")
        return self._requested_at + grace_s

    def seconds_since_request(self) -> float:
        """Loop seconds since the request; raises if there was none."""
        return asyncio.get_running_loop().time() - self.deadline(0.0)
