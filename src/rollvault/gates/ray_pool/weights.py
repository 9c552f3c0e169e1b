"""Weight broadcast through Ray's object store: one ``ray.put`` per weight version.

The pool publishes each version's safetensors bytes once; every actor is
handed the same object reference and fetches the bytes from the object
store itself (shared memory on its node, a transfer from another node),
so the controller serializes and sends a version once whatever the pool size.
Only the newest version is kept: an actor that (re)starts loads the current
one, never an older one.
"""

from __future__ import annotations

from typing import Any

import ray

__all__ = ["WeightBroadcast"]


class WeightBroadcast:
    """The current weight version and its object reference."""

    def __init__(self, version: int, weights: bytes) -> None:
        self.puts = 0
        """``ray.put`` calls made: one per published version."""
        self._version = -1
        self._ref: Any = None
        self.publish(version, weights)

    @property
    def version(self) -> int:
        return self._version

    @property
    def ref(self) -> Any:
        """The object reference of the current version's bytes."""
        return self._ref

    def publish(self, version: int, weights: bytes) -> None:
        """Make ``version`` current; refuses a version older than the current one."""
        if version < self._version:
            raise ValueError(
                f"RayPoolGate: weight version went back from {self._version} to {version}"
            )
        # Dropping the old reference lets the object store free the old version once
        # no actor still fetches it.
        self._ref = ray.put(weights)
        self._version = version
        self.puts += 1
