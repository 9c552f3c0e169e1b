"""Where the seal journal's cost on the GRPO recipe goes: bench_grpo_run with a part switched off.

Usage: python benchmarks/bench_journal_ablation.py MODE [bench_grpo_run.py arguments]

MODE (what the journal arm still does; the none arm is bench_grpo_run's own):
- ``normal``: everything (bench_grpo_run.py as it is);
- ``no_write``: the writer thread frames each group but writes and flushes nothing;
- ``no_writer_work``: the writer thread only marks each group durable;
- ``no_hand_over``: the pump builds each seal's record, but ``seal_many`` hands nothing over
  (no packing, no encoding, no queue put); finalize and step records still go to the writer.

A measurement aid only: it replaces methods of this process's classes before the benchmark
runs, so the run's durability is not what the recipe's is.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from rollvault.controller.loop.seal_journal import SealJournal
from rollvault.durable.journal_writer import JournalWriter

MODES = ("normal", "no_write", "no_writer_work", "no_hand_over")
BENCH = Path(__file__).resolve().parent / "bench_grpo_run.py"


def _mark_durable(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    with writer._cond:
        writer._durable_seq = batch[-1][0]
        writer._wake_async_waiters()


def _encode_only(writer: JournalWriter, batch: list[tuple[int, bytes, bool]]) -> None:
    writer._frame_group(batch)  # encoded and framed as usual; nothing written or flushed
    _mark_durable(writer, batch)


def _hand_over_nothing(journal: SealJournal, entries: object) -> None:
    return None


def _switch_off(mode: str) -> None:
    if mode == "no_write":
        JournalWriter._write_group = _encode_only  # type: ignore[method-assign,assignment]
    elif mode == "no_writer_work":
        JournalWriter._write_group = _mark_durable  # type: ignore[method-assign,assignment]
    elif mode == "no_hand_over":
        SealJournal.seal_many = _hand_over_nothing  # type: ignore[method-assign,assignment]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(MODES)}}} [bench_grpo_run.py arguments]")
    _switch_off(sys.argv.pop(1))
    sys.argv[0] = str(BENCH)
    runpy.run_path(str(BENCH), run_name="__main__")


if __name__ == "__main__":
    main()
