"""When to try the next periodic snapshot after failures, and when to give up.

A snapshot that fails (disk full, I/O error) leaves the previous one intact,
so the run can go on and try again: after ``n`` failures in a row the next
try waits ``interval_s * 2**n``, at most :data:`BACKOFF_CAP` times
``interval_s``, which gives an operator (or a cleanup) time to free space
without a hot loop of failing writes. The ``max_consecutive_failures``-th
failure in a row stops the run; a success resets the count.
"""

from __future__ import annotations

from typing import Final

BACKOFF_CAP: Final = 8
"""The longest wait between tries, in intervals."""


class SnapshotRetry:
    """Counts consecutive failed snapshots and says how long to wait for the next."""

    def __init__(self, *, interval_s: float, max_consecutive_failures: int) -> None:
        if max_consecutive_failures < 1:
            raise ValueError(
                f"max_consecutive_failures must be >= 1, got {max_consecutive_failures}"
            )
        self.interval_s = interval_s
        self.max_consecutive_failures = max_consecutive_failures
        self.consecutive = 0

    def next_wait_s(self) -> float:
        """Seconds until the next try: the interval, doubled per failure in a row, capped."""
        return self.interval_s * min(2**self.consecutive, BACKOFF_CAP)

    def failed(self) -> bool:
        """Count one failure; True when it is the one that must stop the run."""
        self.consecutive += 1
        return self.consecutive >= self.max_consecutive_failures

    def succeeded(self) -> None:
        self.consecutive = 0
