"""Why a run stopped on a write it could not make (disk full, I/O error).

The checkpointer and the append-only logs raise these; the pipeline lets the
first one end the run, and ``rollvault run`` reports it as "cannot continue"
with exit status 3. Everything made durable before the failure is intact:
each message names the cause and the newest good state a restart resumes
from.
"""

from __future__ import annotations


class RunStoppedByIOError(Exception):
    """The run stopped because something it must write could not be written."""


class SnapshotsFailingError(RunStoppedByIOError):
    """``rollout_checkpointing.max_consecutive_failures`` rollout snapshots in a row failed."""


class TrainerCheckpointWriteError(RunStoppedByIOError):
    """A trainer checkpoint could not be written; the previous one is intact."""


class LogWriteError(RunStoppedByIOError):
    """A line of a run log or of the dispatch journal could not be written.

    The line was cut off whole and the file refuses every later line: the
    logs are the run's exactly-once evidence, so nothing may follow a
    missing line.
    """


def first_stop(group: BaseExceptionGroup[RunStoppedByIOError]) -> RunStoppedByIOError:
    """The first :class:`RunStoppedByIOError` of a (possibly nested) exception group."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, RunStoppedByIOError)
    return first
