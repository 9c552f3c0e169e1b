"""The run lock: one owner per checkpoint directory, released by the kernel on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollvault.durable.run_lock import (
    RUN_LOCK_FILENAME,
    RunLockedError,
    acquire_run_lock,
    read_run_lock_holder,
)


def test_second_acquire_is_refused_and_names_the_holder(tmp_path: Path) -> None:
    with acquire_run_lock(tmp_path / "ckpt", command=["rollvault", "run", "a"]) as lock:
        assert lock.held
        with pytest.raises(RunLockedError) as refused:
            acquire_run_lock(tmp_path / "ckpt", command=["rollvault", "run", "b"])
        holder = refused.value.holder
        assert holder is not None
        assert holder.pid == os.getpid()
        assert holder.command == ["rollvault", "run", "a"]
        assert f"pid {os.getpid()}" in str(refused.value)
        assert "rollvault run a" in str(refused.value)
    assert not lock.held
    # Released: the record is cleared and the next run takes it.
    assert read_run_lock_holder(tmp_path / "ckpt") is None
    with acquire_run_lock(tmp_path / "ckpt", command=["again"]) as again:
        assert again.holder.command == ["again"]


def test_release_is_idempotent(tmp_path: Path) -> None:
    lock = acquire_run_lock(tmp_path, command=["x"])
    lock.release()
    lock.release()
    assert not lock.held


def test_unreadable_record_still_refuses(tmp_path: Path) -> None:
    with acquire_run_lock(tmp_path, command=["x"]):
        (tmp_path / RUN_LOCK_FILENAME).write_bytes(b"{not json")
        with pytest.raises(RunLockedError, match="record is unreadable"):
            acquire_run_lock(tmp_path)


@pytest.mark.slow
def test_lock_of_a_killed_process_is_released_by_the_kernel(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from rollvault.durable.run_lock import acquire_run_lock
        lock = acquire_run_lock(Path({str(tmp_path)!r}), command=["child"])
        print("held", flush=True)
        time.sleep(120)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as refused:
            acquire_run_lock(tmp_path, command=["parent"])
        assert refused.value.holder is not None
        assert refused.value.holder.pid == child.pid
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
    # The child never released it; its death did. Its stale record does not matter.
    with acquire_run_lock(tmp_path, command=["parent"]) as lock:
        assert lock.holder.pid == os.getpid()
