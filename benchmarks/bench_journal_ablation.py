"""Where the seal journal's cost on the GRPO recipe goes: bench_grpo_run with a part switched off.

Usage: python benchmarks/bench_journal_ablation.py MODE [--blocks] [benchmark arguments]

``--blocks`` runs ``bench_journal_blocks.py`` (the journal's seals on and off in
alternating blocks of one run) instead of ``bench_grpo_run.py``: its "on" blocks
then do what MODE leaves of the seal path, its "off" blocks hand no seal over.

MODE (what the journal arm still does; the none arm is bench_grpo_run's own):
- ``normal``: everything (bench_grpo_run.py as it is);
- ``no_write``: the writer thread frames each group but writes and flushes nothing;
- ``no_writer_work``: the writer thread only marks each group durable;
- ``no_hand_over``: the pump builds each seal's record, but ``seal_many`` hands nothing over
  (no packing, no encoding, no queue put); finalize and step records still go to the writer;
- ``pack_only``: ``seal_many`` packs a batch's rows in columns, then drops the record;
- ``encode_only``: ``seal_many`` packs and encodes, then drops the bytes;
- ``no_fsync``: the writer frames and writes each group but does not flush it;
- ``sleep``: as ``no_fsync``, then sleeps 0.7 ms (about a median ``fsync`` here) with the GIL
  released, as the ``fsync`` would: its timing without its kernel work;
- ``prealloc``: each segment is zero-filled (8 MiB) when it is created and each group is
  written over the zeros (``pwrite``) and flushed with ``fdatasync``: no block allocation or
  size change to commit per group (the on-disk form this gives is not one a reader takes).

A measurement aid only: it replaces methods of this process's classes before the benchmark
runs, so the run's durability is not what the recipe's is. Every mode, ``normal`` too, runs
the journal's writer as a thread of this process (``journal.writer=thread``): the modes
replace the thread writer's methods, which a writer process would never run.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rollvault.controller.loop.seal_journal import (
    SealJournal,
    StagedSeal,
    _seal_payloads,
    seal_batch_record,
)
from rollvault.durable.fsync import _write_all
from rollvault.durable.journal_writer import JournalWriter, _write_buffer

BENCH = Path(__file__).resolve().parent / "bench_grpo_run.py"
BLOCKS = Path(__file__).resolve().parent / "bench_journal_blocks.py"
FSYNC_LIKE_S = 0.0007
PREALLOC_BYTES = 8 << 20
THREAD_WRITER = "rollout_checkpointing.journal.writer=thread"
_NEW_SEGMENT = JournalWriter._new_segment


def _mark_durable(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    with writer._cond:
        writer._durable_seq = batch[-1][0]
        writer._wake_async_waiters()


def _encode_only(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    writer._frame_group(batch)  # encoded and framed as usual; nothing written or flushed
    _mark_durable(writer, batch)


def _hand_over_nothing(journal: SealJournal, entries: object) -> None:
    return None


def _pack_only(journal: SealJournal, entries: list[StagedSeal]) -> None:
    seal_batch_record(entries)


def _pack_and_encode_only(journal: SealJournal, entries: list[StagedSeal]) -> None:
    _seal_payloads(entries)


def _written(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    data = writer._frame_group(batch)
    _write_buffer(writer._require_fd(), data)
    writer._segment_size += len(data)


def _write_no_fsync(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    _written(writer, batch)
    _mark_durable(writer, batch)


def _write_sleep(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    _written(writer, batch)
    time.sleep(FSYNC_LIKE_S)
    _mark_durable(writer, batch)


def _prealloc_segment(writer: JournalWriter, first_seq: int) -> int:
    # The writer's own segment start (header, flushes, the segment listed), then zeros
    # after the header, through a descriptor without O_APPEND: groups go at their offsets.
    os.close(_NEW_SEGMENT(writer, first_seq))
    fd = os.open(writer._segments[-1][1], os.O_WRONLY)
    os.lseek(fd, 0, os.SEEK_END)
    zeros = bytes(1 << 20)
    for _ in range(PREALLOC_BYTES >> 20):
        _write_all(fd, zeros)
    os.fsync(fd)
    return fd


def _pwrite_fdatasync(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    fd = writer._require_fd()
    view = memoryview(writer._frame_group(batch))
    offset = writer._segment_size
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
    os.fdatasync(fd)
    writer._segment_size = offset
    _mark_durable(writer, batch)


PATCHES: dict[str, list[tuple[type, str, Callable[..., object]]]] = {
    "normal": [],
    "no_write": [(JournalWriter, "_write_group", _encode_only)],
    "no_writer_work": [(JournalWriter, "_write_group", _mark_durable)],
    "no_hand_over": [(SealJournal, "seal_many", _hand_over_nothing)],
    "pack_only": [(SealJournal, "seal_many", _pack_only)],
    "encode_only": [(SealJournal, "seal_many", _pack_and_encode_only)],
    "no_fsync": [(JournalWriter, "_write_group", _write_no_fsync)],
    "sleep": [(JournalWriter, "_write_group", _write_sleep)],
    "prealloc": [
        (JournalWriter, "_new_segment", _prealloc_segment),
        (JournalWriter, "_write_group", _pwrite_fdatasync),
    ],
}
"""Per MODE, the methods it replaces: (class, method name, replacement)."""
MODES = tuple(PATCHES)


def _switch_off(mode: str) -> None:
    for owner, name, replacement in PATCHES[mode]:
        setattr(owner, name, replacement)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(MODES)}}} [--blocks] [benchmark arguments]")
    _switch_off(sys.argv.pop(1))
    sys.argv += ["--set", THREAD_WRITER]
    script = BENCH
    if "--blocks" in sys.argv:
        sys.argv.remove("--blocks")
        script = BLOCKS
        sys.path.insert(0, str(script.parent))
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
