"""The journal's writer in a child process: the thread writer's behaviour, from another process."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from rollvault.durable.faults import KILL_AT_ENV, TRACE_ENV
from rollvault.durable.journal_format import list_segments, read_journal
from rollvault.durable.journal_process import JournalProcessWriter
from rollvault.durable.journal_writer import JournalWriteError

WAIT_S = 30.0


def _payloads(directory: Path) -> list[bytes]:
    return [record.payload for record in read_journal(directory).records]


def test_records_reach_disk_in_order_in_groups_and_a_reopen_continues(tmp_path: Path) -> None:
    writer, repair = JournalProcessWriter.open(tmp_path, commit_interval_s=0.05)
    assert repair.replay.next_seq == 0 and repair.truncated is None
    first = writer.append_many([b"a", b"b", b"c"])
    lazy = writer.append(b"lazy", lazy=True)
    last = writer.append_many([bytes([n]) * 1000 for n in range(50)])
    assert (first, lazy, last) == (range(0, 3), 3, range(4, 54))
    assert writer.wait_durable(53, timeout=WAIT_S)
    stats = writer.stats()
    assert (stats.appended_seq, stats.durable_seq) == (53, 53)
    # Group commit in the child: 54 records, far fewer flushes.
    assert 1 <= stats.fsyncs < 10
    assert stats.bytes_written > 50 * 1000
    writer.close()
    assert _payloads(tmp_path) == [b"a", b"b", b"c", b"lazy"] + [
        bytes([n]) * 1000 for n in range(50)
    ]
    again, repair = JournalProcessWriter.open(tmp_path)
    assert repair.replay.next_seq == 54
    assert again.append(b"next") == 54
    again.close()
    assert _payloads(tmp_path)[-1] == b"next"


def test_rotate_flushes_what_came_before_and_drop_through_keeps_uncovered_segments(
    tmp_path: Path,
) -> None:
    writer, _ = JournalProcessWriter.open(tmp_path, lazy_interval_s=60.0)
    writer.append_many([b"r0", b"r1"], lazy=True)  # lazy: only the rotation flushes them
    assert writer.rotate() == 2
    assert writer.durable_seq == 1
    writer.append(b"r2")
    assert writer.rotate() == 3
    oldest = list_segments(tmp_path)[0][1]
    assert writer.drop_through(1) == [oldest]
    assert [first for first, _ in list_segments(tmp_path)] == [2, 3]
    writer.close()
    assert _payloads(tmp_path) == [b"r2"]


def test_until_durable_resolves_on_the_event_loop(tmp_path: Path) -> None:
    writer, _ = JournalProcessWriter.open(tmp_path, commit_interval_s=0.02)

    async def main() -> int:
        seq = writer.append(b"x")
        await asyncio.wait_for(writer.until_durable(seq), WAIT_S)
        return writer.durable_seq

    assert asyncio.run(main()) == 0
    writer.close()


def test_a_payload_that_is_not_bytes_is_refused_before_anything_is_handed_over(
    tmp_path: Path,
) -> None:
    writer, _ = JournalProcessWriter.open(tmp_path)
    with pytest.raises(TypeError, match="record 1 of 2 is a bytearray"):
        writer.append_many([b"ok", bytearray(b"no")])  # type: ignore[list-item]
    assert writer.append(b"first") == 0
    writer.close()
    assert _payloads(tmp_path) == [b"first"]
    with pytest.raises(ValueError, match="the writer was closed"):
        writer.append(b"late")


def test_a_full_disk_stops_the_writer_and_keeps_what_was_durable(
    small_filesystem: Callable[[int], Path],
) -> None:
    directory = small_filesystem(256 * 1024) / "journal"
    writer, _ = JournalProcessWriter.open(directory, commit_interval_s=0.0)
    kept = writer.append(b"k" * 1000)
    assert writer.wait_durable(kept, timeout=WAIT_S)
    lost = writer.append(b"x" * 400_000)  # more than the filesystem holds
    with pytest.raises(JournalWriteError, match="No space left on device"):
        writer.wait_durable(lost, timeout=WAIT_S)
    with pytest.raises(JournalWriteError, match="No space left on device"):
        writer.append(b"refused")
    with pytest.raises(JournalWriteError):
        writer.close()
    assert writer._process.poll() is not None
    assert _payloads(directory) == [b"k" * 1000]


def test_a_dead_writer_process_stops_the_writer_naming_its_exit(tmp_path: Path) -> None:
    writer, _ = JournalProcessWriter.open(tmp_path, commit_interval_s=0.0)
    writer.wait_durable(writer.append(b"kept"), timeout=WAIT_S)
    os.kill(writer.pid, signal.SIGKILL)  # the child this test's writer started
    writer._process.wait(WAIT_S)
    with pytest.raises(
        JournalWriteError, match=r"writer process stopped answering \(exit code -9\)"
    ):
        writer.append(b"refused")
    with pytest.raises(JournalWriteError):
        writer.rotate()
    with pytest.raises(JournalWriteError):
        writer.close()
    assert _payloads(tmp_path) == [b"kept"]


_PARENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from rollvault.durable.journal_process import JournalProcessWriter

    writer, _ = JournalProcessWriter.open(Path(sys.argv[1]), lazy_interval_s=600.0)
    writer.wait_durable(writer.append(b"durable"), timeout=30)
    writer.append(b"held", lazy=True)  # not flushed for ten minutes
    print(writer.pid, flush=True)
    sys.stdin.read()
    """
)


def test_the_writer_process_exits_with_its_parent_writing_nothing_more(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        child = os.pidfd_open(child_pid)
        parent.kill()  # the process this test started, by its pid
        parent.wait(WAIT_S)
        try:
            exited, _, _ = select.select([child], [], [], WAIT_S)
        finally:
            os.close(child)
        assert exited, f"the writer process {child_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    # What was durable stays; the record it still held went with it, as a thread's would.
    assert _payloads(tmp_path) == [b"durable"]


_KILLED_AT_A_FAULT_POINT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from rollvault.durable.journal_process import JournalProcessWriter

    writer, _ = JournalProcessWriter.open(Path(sys.argv[1]), commit_interval_s=0.0)
    print(writer.pid, flush=True)
    for n in range(5):
        writer.wait_durable(writer.append(b"record %d" % n), timeout=30)
    print("not killed", flush=True)
    """
)


def test_a_kill_at_a_fault_point_of_the_writer_process_kills_the_run_it_is_part_of(
    tmp_path: Path,
) -> None:
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        KILL_AT_ENV: "journal.records_synced:2",
    }
    environ.pop(TRACE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_A_FAULT_POINT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    child_pid = int(done.stdout.split()[0])
    assert "not killed" not in done.stdout
    assert not Path(f"/proc/{child_pid}").exists() or _is_zombie(child_pid)
    assert _payloads(tmp_path) == [b"record 0", b"record 1"]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True
