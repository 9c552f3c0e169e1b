"""When the next periodic snapshot is due: the interval, counted from the newest committed state.

The interval is ``rollout_checkpointing.interval_s``, or when that is null
(the default) it depends on what else keeps the sealed work
(:func:`interval_for`): while the seal journal takes records, every seal is
durable within a commit interval whatever the snapshots do, and a snapshot
only bounds how much journal a restore replays (the checkpointer also makes
one due once the journal grew by ``journal.snapshot_after_mib``), so they can
be a minute apart; without the journal, a kill loses everything sealed since
the newest snapshot, so they are seconds apart.

The interval counts from the newest state committed by either path: a
periodic snapshot, or a trainer checkpoint (whose rollout state is what a
restart would resume from until the next snapshot). A periodic snapshot
right after a trainer checkpoint would write the same state again; on a run
whose trainer checkpoints are closer together than ``interval_s``, none is
written between them, and the seal journal (rotated by either) keeps what
was sealed since.

A snapshot that fails (disk full, I/O error) leaves the previous one intact,
so the run can go on and try again: after ``n`` failures in a row the next
try waits ``interval_s * 2**n``, at most :data:`BACKOFF_CAP` times
``interval_s``, which gives an operator (or a cleanup) time to free space
without a hot loop of failing writes. The ``max_consecutive_failures``-th
failure in a row stops the run; a success resets the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

BACKOFF_CAP: Final = 8
"""The longest wait between tries, in intervals."""
JOURNALED_INTERVAL_S: Final = 60.0
"""The default interval while the seal journal keeps every seal."""
UNJOURNALED_INTERVAL_S: Final = 5.0
"""The default interval without it (off, or stopped by a failed write)."""


def interval_for(configured_s: float | None, *, journal_keeps_seals: bool) -> float:
    """The periodic snapshots' interval: ``configured_s``, or by default (None) one that
    fits what keeps the sealed work between snapshots."""
    if configured_s is not None:
        return configured_s
    return JOURNALED_INTERVAL_S if journal_keeps_seals else UNJOURNALED_INTERVAL_S


class SnapshotSchedule:
    """Says when the next periodic snapshot is due, and counts consecutive failed ones."""

    def __init__(
        self,
        *,
        interval_s: float,
        max_consecutive_failures: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_consecutive_failures < 1:
            raise ValueError(
                f"max_consecutive_failures must be >= 1, got {max_consecutive_failures}"
            )
        self.interval_s = interval_s
        self.max_consecutive_failures = max_consecutive_failures
        self.consecutive = 0
        self._clock = clock
        self._due = clock() + interval_s

    def next_wait_s(self) -> float:
        """Seconds from a try to the next: the interval, doubled per failure in a row, capped."""
        return self.interval_s * min(2**self.consecutive, BACKOFF_CAP)

    def due_in_s(self) -> float:
        """Seconds until the next periodic snapshot is due (<= 0: it is due now)."""
        return self._due - self._clock()

    def start(self) -> None:
        """The periodic snapshots start now: the first is due one interval later."""
        self._due = max(self._due, self._clock() + self.interval_s)

    def tried(self) -> None:
        """A periodic snapshot was tried (written, skipped or failed): the next is due
        :meth:`next_wait_s` from now (count a failure with :meth:`failed` first)."""
        self._due = self._clock() + self.next_wait_s()

    def committed_elsewhere(self) -> None:
        """A trainer checkpoint committed the run's state: no periodic snapshot is due
        before one interval from now."""
        self._due = max(self._due, self._clock() + self.interval_s)

    def failed(self) -> bool:
        """Count one failure; True when it is the one that must stop the run."""
        self.consecutive += 1
        return self.consecutive >= self.max_consecutive_failures

    def succeeded(self) -> None:
        self.consecutive = 0
