"""The processes of a private Ray: how a start finds those a killed driver left, and kills them.

A driver SIGKILLed with a private Ray running takes its GCS server and
raylet with it (Ray ties them to the driver's life), but not everything:
Ray's dashboard and runtime-env agents are reparented to init and live on,
and a worker busy in a call may outlive its raylet for a while. They cannot
be found by name (another run's Ray looks the same) nor by command line
(Ray renames its processes ``ray::...``, which also overwrites their
environment block). So two records name them:

- the driver records every process that descends from it right after
  ``ray.init`` and did not before (pid and start time, so a reused pid is
  never mistaken for one of them), in the Ray temp dir: its other children
  (multiprocessing's resource tracker, a process of the caller's) are not Ray's;
- the driver puts a marker variable, :data:`MARKER_ENV`, set to the run's
  Ray temp dir, in the environment Ray's processes inherit, which finds
  the ones started later (workers) as long as they have not renamed
  themselves over it.

The next start of the same run (it holds the run lock, so that driver is
gone) kills exactly those processes, and no others. Linux only (``/proc``);
elsewhere nothing is found and nothing is killed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Final

import msgspec

__all__ = [
    "MARKER_ENV",
    "ProcessId",
    "descendants",
    "marked_processes",
    "process_start_time",
    "reap",
]

MARKER_ENV: Final = "ROLLVAULT_RAY_SESSION"
"""Set to the run's Ray temp dir in every process of its private Ray."""

_PROC: Final = Path("/proc")
_REAP_WAIT_S: Final = 10.0


class ProcessId(msgspec.Struct, frozen=True, array_like=True):
    """A process, told apart from a later one that reuses its pid by its start time."""

    pid: int
    start_time: int

    def running(self) -> bool:
        return process_start_time(self.pid) == self.start_time


def descendants(pid: int) -> list[ProcessId]:
    """Every running process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else []:
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        start = process_start_time(child)
        if start is not None:
            found.append(ProcessId(child, start))
        todo.extend(children.get(child, []))
    return found


def marked_processes(marker: str) -> list[int]:
    """Pids of this user's processes (not this one) whose environment has ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    uid = os.getuid()
    found = []
    for entry in _PROC.iterdir() if _PROC.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if b"\0" + needle in b"\0" + environ:
            found.append(int(entry.name))
    return found


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None: no such process).

    With the pid it identifies a process even after the pid is reused."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def reap(marker: str, recorded: list[ProcessId]) -> list[int]:
    """SIGKILL the ``recorded`` processes still running and every process carrying
    ``marker``, and wait until they are gone.

    Returns the pids killed. Raises ``TimeoutError`` naming the survivors."""
    pids = sorted({p.pid for p in recorded if p.running()} | set(marked_processes(marker)))
    pids = [pid for pid in pids if pid != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + _REAP_WAIT_S
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return pids
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray processes {alive} of {marker} survived SIGKILL")
        time.sleep(0.05)


def _parent(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and waiting for its parent to reap it, is not)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
