"""The processes of a private Ray, found by a marker in their environment, and their reaping.

A private Ray started by a driver that is then SIGKILLed leaves its GCS
server, raylet, monitors and workers behind. They cannot be found by name
(another run's Ray looks the same) nor by command line (Ray workers rename
themselves ``ray::...``), so the driver puts a marker variable in the
environment Ray's processes inherit, :data:`MARKER_ENV`, whose value is the
run's own Ray temp dir. The next start of the same run (which holds the
run lock, so the driver that started them is gone) kills exactly the
processes of this user carrying that value, and no others. Linux only
(``/proc``); elsewhere nothing is found and nothing is killed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Final

__all__ = ["MARKER_ENV", "marked_processes", "process_start_time", "reap_marked"]

MARKER_ENV: Final = "ROLLVAULT_RAY_SESSION"
"""Set to the run's Ray temp dir in every process of its private Ray."""

_PROC: Final = Path("/proc")
_REAP_WAIT_S: Final = 10.0


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


def reap_marked(marker: str) -> list[int]:
    """SIGKILL every process carrying ``marker`` and wait until they are gone.

    Returns the pids killed. Raises ``TimeoutError`` naming the survivors."""
    pids = marked_processes(marker)
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


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and waiting for its parent to reap it, is not)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
