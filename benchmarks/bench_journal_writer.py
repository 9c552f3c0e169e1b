"""What the seal journal's writer costs the machine per generation batch, by placement.

Appends a batch-sized record (default 122 KB, a GRPO recipe step's seals) and a
small lazy one (its finalizations and step) every ``--gap-ms`` (a step's time),
``--batches`` times, to a :class:`~rollvault.durable.journal_writer.JournalWriter`
(``thread``) or a :class:`~rollvault.durable.journal_process.JournalProcessWriter`
(``process``), with the default group commit, and reports per batch:

- ``caller_us``: the appending thread's CPU (``thread_time`` around the calls);
- ``writer_ms``: the writer's CPU: the child's (``/proc/<pid>/stat``) or, for the
  thread, this process's CPU minus the caller's;
- ``machine_ms``: the whole machine's busy time (``/proc/stat``, every process and
  kernel thread: the file system's journal commit included), minus what the same
  loop costs with no journal (``--placement none``, measured in the same run).

Placements alternate ``--rounds`` times, so a drift of the shared machine hits
each. The appender sleeps between batches, as the event loop leaves the writer
alone between generation batches, so every figure includes waking up cold.

Usage: python benchmarks/bench_journal_writer.py [--rounds N] [--batches N]
       [--record-bytes N] [--gap-ms MS] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rollvault.durable.journal_process import JournalProcessWriter
from rollvault.durable.journal_writer import JournalWriter

PLACEMENTS = ("none", "thread", "process")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S  # all but idle and iowait


def run_once(placement: str, directory: Path, args: argparse.Namespace) -> dict[str, float]:
    """One placement's ``args.batches`` batches: its costs per batch."""
    record = os.urandom(args.record_bytes)
    small = os.urandom(2_000)
    writer: JournalWriter | JournalProcessWriter | None = None
    if placement == "thread":
        writer, _ = JournalWriter.open(directory)
    elif placement == "process":
        writer, _ = JournalProcessWriter.open(directory)
    child_start = _process_cpu_s(writer.pid) if isinstance(writer, JournalProcessWriter) else 0.0
    machine_start, process_start = _machine_busy_s(), time.process_time()
    caller = 0.0
    for _ in range(args.batches):
        started = time.thread_time()
        if writer is not None:
            writer.append_many([record])
            writer.append_many([small], lazy=True)
        caller += time.thread_time() - started
        time.sleep(args.gap_ms / 1000.0)
    machine = _machine_busy_s() - machine_start
    process = time.process_time() - process_start
    if isinstance(writer, JournalProcessWriter):
        writer_cpu = _process_cpu_s(writer.pid) - child_start
    else:
        writer_cpu = process - caller
    fsyncs = 0
    if writer is not None:
        fsyncs = writer.stats().fsyncs
        writer.close()
    per = 1.0 / args.batches
    return {
        "caller_us": caller * per * 1e6,
        "writer_ms": writer_cpu * per * 1e3,
        "machine_ms": machine * per * 1e3,
        "fsyncs_per_batch": fsyncs * per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--record-bytes", type=int, default=122_000)
    parser.add_argument("--gap-ms", type=float, default=40.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {placement: [] for placement in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="bench_journal_writer_", dir=".") as name:
        for round_index in range(args.rounds):
            for placement in PLACEMENTS:
                directory = Path(name) / f"{round_index}_{placement}"
                result = run_once(placement, directory, args)
                results[placement].append(result)
                print(f"round {round_index + 1} {placement:8s}: " + json.dumps(result))
    baseline = statistics.median(r["machine_ms"] for r in results["none"])
    summary = {}
    for placement in ("thread", "process"):
        rows = results[placement]
        summary[placement] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        summary[placement]["machine_over_none_ms"] = summary[placement]["machine_ms"] - baseline
        print(f"median {placement:8s}: " + json.dumps(summary[placement]))
    if args.json:
        print(json.dumps({"summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
