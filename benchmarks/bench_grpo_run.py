"""Benchmark of the real training recipe (issue 6, "Benchmark").

Runs the addition recipe (``configs/grpo_addition.yaml``: the default tiny
model, the local model gate with its worker process, the GRPO trainer)
in-process, several times, alternating two arms in the same run:

- **snapshots**: rollout snapshots as the recipe schedules them
  (``rollout_checkpointing.interval_s``; ``--set`` one to measure another);
- **none**: no periodic snapshots (``interval_s`` longer than the run) and no
  seal journal.

Since issue 16 the **snapshots** arm also writes the seal journal (every
seal with its rows, every finalization and step, group-committed by its
writer: since stop 43 a child process of the controller's, see
``rollout_checkpointing.journal.writer``), as the recipe does by default;
``--journal off`` measures snapshots alone.

Both arms keep the recipe's trainer checkpoints (every ``save_period`` = 50
steps, each with its full rollout snapshot), so the arms differ only by the
periodic snapshots. (Turning ``rollout_checkpointing.enabled`` off would drop
the trainer checkpoints too, and without trainer checkpoints every snapshot
carries the rows of every step since the start, a cost no real run pays.)
A run must outlast ``interval_s`` for the periodic snapshots to happen at
all: a 100-step run takes ~4 s, so until stop 36 the default runs measured
the seal journal alone. Each run now reports the snapshots published inside
its timed window, and the summary says when the arms differ by none there.
Since stop 37 a periodic snapshot falls due ``interval_s`` after the newest
committed state, a trainer checkpoint's included: where the recipe's 50 steps
between trainer checkpoints take less than ``interval_s`` (~2 s at stop 36's
~25 steps/s), none falls due in either arm, and the arms differ by the seal
journal alone, as they do in a real run of the recipe on such a machine.
Since stop 39 the recipe leaves ``interval_s`` to its default, which is 60 s
while the seal journal keeps every seal (and a snapshot is also due once the
journal grew ``journal.snapshot_after_mib``): with trainer checkpoints every
50 steps, the journal arm then has no periodic snapshot in its window on any
machine that makes 50 steps in under a minute. ``--set
rollout_checkpointing.interval_s=5`` measures the former schedule.
Every run starts from the
same warmed-up model: the recipe's supervised warm-up runs once, first, and
is timed on its own. Per run it measures, between its first and its last
optimizer step (so the worker's start-up is excluded): train steps per
second and rollout (response) tokens per second. Arms are interleaved
(ABBA...) so a drift of the shared machine's load hits both; the script
prints each run, the median per arm, and the per-round ratio with its median
(the paired figure, the least sensitive to other processes' bursts).

Memory: the peak resident set (``VmHWM`` from ``/proc/<pid>/status``) of this
process (controller + trainer) and of every process below it (the generation
worker and multiprocessing's resource tracker), sampled every few steps; the
sum of the peaks bounds the run's peak (they need not coincide). This process
runs every arm in turn, so its peak is that of the heaviest run or more.

Snapshot cost, directly: the checkpointer's two worker-thread steps after the
cut is released, ``build_snapshot`` (the sidecar) and ``publish_snapshot``
(encoding, writing, commit), are wrapped to record their wall time and their
thread's CPU time; and every run reports this process's CPU time per step
(event loop, trainer and snapshot threads), so the cost can be read as CPU,
not only as a throughput difference within the machine's noise.

Where the CPU goes: each run also reports the event loop's own CPU per step
(``thread_time`` of the thread running ``asyncio.run``: dispatch, seals, the
seal batch, finalization, the logs) and the seal journal's writer's CPU per
step: a writer thread's (``--set rollout_checkpointing.journal.writer=thread``;
it holds the GIL while it frames and writes records, so it competes with the
event loop in this process), or the writer process's (read from ``/proc`` as
it closes; its CPU is also in the children's). The queued-to-durable latency
probe times the thread writer only. ``--profile DIR`` writes a
cProfile of each run's event loop thread to ``DIR/<round>_<arm>.prof`` and of its
snapshots' two worker-thread steps to ``DIR/<round>_<arm>.snapshots.prof`` (and of
the journal writer thread to ``DIR/<round>_<arm>.writer.prof``).

The cyclic garbage collector: its passes per step and their CPU per step, by
generation, in the same window (``gc.callbacks``; the pipeline's own collection
before it freezes what exists at its start comes before the first step).

Finally, ``--curve-steps`` more steps of one snapshots run give the reward
and accuracy curve, summarised by windows of 25 steps.

Usage: python benchmarks/bench_grpo_run.py [--steps N] [--rounds N] [--curve-steps N]
       [--set DOTPATH=VALUE ...] [--journal on|off] [--probes on|off] [--profile DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.rollout_pump import RolloutPump
from rollvault.controller.loop.seal_journal import SealJournal
from rollvault.controller.snapshots import checkpointer as checkpointer_module
from rollvault.durable.journal_process import JournalProcessWriter
from rollvault.durable.journal_writer import JournalWriter
from rollvault.recipes.async_grpo import prepare
from rollvault.tasks.registry import build_dataset
from rollvault.tasks.warmup import warmup_examples
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.warmup import supervised_warmup

RECIPE = Path(__file__).resolve().parent.parent / "src/rollvault/configs/grpo_addition.yaml"
ARMS = ("snapshots", "none")


@dataclass
class SnapshotTimes:
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    """``perf_counter`` at each call's start (the step marks' clock)."""


def timed(
    function: Callable[..., Any], times: SnapshotTimes, profiler: cProfile.Profile | None = None
) -> Callable[..., Any]:
    """``function`` (run in a worker thread), recording wall and thread-CPU seconds per call
    (and profiling each call into ``profiler``, if given)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        times.started_at.append(wall)
        if profiler is not None:
            profiler.enable()
        try:
            return function(*args, **kwargs)
        finally:
            if profiler is not None:
                profiler.disable()
            times.wall_s.append(time.perf_counter() - wall)
            times.cpu_s.append(time.thread_time() - cpu)

    return wrapper


class WriterCpu:
    """CPU seconds of every journal writer that ended, recorded as it ends: a writer
    thread's (and a cProfile of those threads, if ``profiler`` is given), or a writer
    process's."""

    def __init__(self, profiler: cProfile.Profile | None = None) -> None:
        self.seconds = 0.0
        self.profiler = profiler

    def wrap(self, run: Callable[[JournalWriter], None]) -> Callable[[JournalWriter], None]:
        def wrapper(writer: JournalWriter) -> None:
            if self.profiler is not None:
                self.profiler.enable()
            try:
                run(writer)
            finally:
                if self.profiler is not None:
                    self.profiler.disable()
                self.seconds += time.thread_time()

        return wrapper

    def wrap_close(
        self, close: Callable[[JournalProcessWriter], None]
    ) -> Callable[[JournalProcessWriter], None]:
        def wrapper(writer: JournalProcessWriter) -> None:
            if writer._process.poll() is None:
                self.seconds += TICK_S * processes_cpu_ticks([writer.pid])
            close(writer)

        return wrapper


class DurableLatency:
    """Seal-to-durable latency: from a non-lazy record's queueing (``JournalWriter._enqueue``,
    on the event loop) to the end of the group write that made it durable
    (``_write_group``, on the writer thread): what a crash in between loses."""

    def __init__(self) -> None:
        self.queued: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        enqueue, write_group = JournalWriter._enqueue, JournalWriter._write_group
        self._originals = {"_enqueue": enqueue, "_write_group": write_group}

        def timed_enqueue(writer: JournalWriter, payloads: Any, lazy: bool) -> range:
            seqs = enqueue(writer, payloads, lazy)
            if not lazy:
                now = time.perf_counter()
                self.queued.update((seq, now) for seq in seqs)
            return seqs

        def timed_write_group(writer: JournalWriter, batch: list[Any]) -> None:
            write_group(writer, batch)
            now = time.perf_counter()
            for seq, _, _ in batch:
                queued = self.queued.pop(seq, None)
                if queued is not None:
                    self.latencies_ms.append(1000 * (now - queued))

        JournalWriter._enqueue = timed_enqueue  # type: ignore[method-assign,assignment]
        JournalWriter._write_group = timed_write_group  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        for name, function in self._originals.items():
            setattr(JournalWriter, name, function)


class JournalLoopCpu:
    """Thread CPU seconds of the seal journal's own calls on the event loop: building each
    seal's record (``RolloutPump._staged_seal``) and handing records over (packing,
    encoding and queueing: ``SealJournal.seal_many``, ``finalized``, ``step``,
    ``partial``). The rest of the journal's cost to the loop is indirect (the writer
    thread's GIL and core): the loop's CPU per step against the none arm's shows it."""

    HANDED_OVER = ("seal_many", "finalized", "step", "partial")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        for name in self.HANDED_OVER:
            self._originals[name] = getattr(SealJournal, name)
            setattr(SealJournal, name, self._timed(self._originals[name]))
        self._originals["_staged_seal"] = RolloutPump._staged_seal
        RolloutPump._staged_seal = self._timed_async(  # type: ignore[method-assign]
            RolloutPump._staged_seal
        )

    def remove(self) -> None:
        for name in self.HANDED_OVER:
            setattr(SealJournal, name, self._originals[name])
        RolloutPump._staged_seal = self._originals["_staged_seal"]  # type: ignore[method-assign]

    def _timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return wrapper

    def _timed_async(self, function: Callable[..., Any]) -> Callable[..., Any]:
        # The record is built without suspending when the gate handed the rows over (the
        # recipe's case); a read back from the data plane would count the loop's other
        # work done meanwhile.
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return await function(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return wrapper


class CollectorTime:
    """The cyclic garbage collector's passes in the timed window (from the first step's
    mark on), per generation: how many and their thread CPU time (``gc.callbacks``). The
    pipeline's own ``gc.collect`` before it freezes what exists at its start comes before
    the first step and is left out. Passes never overlap (the collector runs one at a time,
    with the GIL held), so one start time serves."""

    def __init__(self) -> None:
        self.counting = False
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        elif self.counting:
            self.passes[info["generation"]] += 1
            self.seconds[info["generation"]] += time.thread_time() - self._started


TIMED_STEPS = ("build_snapshot", "publish_snapshot")
"""The checkpointer's two worker-thread steps of a snapshot, after the cut: build
the sidecar from the capture, then encode, write and commit the files."""


@dataclass
class RunResult:
    arm: str
    steps: int
    seconds: float
    steps_per_s: float
    tokens_per_s: float
    snapshots_written: int
    parent_peak_mib: float
    snapshots_timed: int = 0
    """Snapshots published between the run's first and last step marks (the timed window):
    the periodic ones the arms differ by, when the run is long enough for them."""
    controller_cpu_ms_per_step: float = 0.0
    """CPU time of this process (event loop, trainer, snapshot threads) per step."""
    loop_cpu_ms_per_step: float = 0.0
    """CPU time of the event loop's thread alone per step."""
    writer_cpu_ms_per_step: float = 0.0
    """CPU time of the seal journal's writer thread per step (0: no journal)."""
    journal_loop_cpu_ms_per_step: float = 0.0
    """CPU time of the seal journal's own calls on the event loop per step
    (:class:`JournalLoopCpu`; 0: no journal)."""
    children_peak_mib: dict[int, float] = field(default_factory=dict)
    """Per child process (the generation worker, multiprocessing's resource tracker)."""
    rewards: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    snapshot_times: dict[str, SnapshotTimes] = field(
        default_factory=lambda: {name: SnapshotTimes() for name in TIMED_STEPS}
    )
    journal: dict[str, float] = field(default_factory=dict)
    """The seal journal's metrics at the last step (``journal/...``; empty: off)."""
    durable_latency_ms: list[float] = field(default_factory=list)
    """Per non-lazy journal record, queued to durable (:class:`DurableLatency`)."""
    gc_passes_per_step: list[float] = field(default_factory=list)
    """The cyclic collector's passes per step, generations 0, 1, 2 (:class:`CollectorTime`)."""
    gc_ms_per_step: list[float] = field(default_factory=list)
    """Their CPU time per step, generations 0, 1, 2."""
    load_average: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average at the run's start and end (other processes'
    work included: the shared machine's noise, for reading the ratios)."""
    step_seconds: list[float] = field(default_factory=list)
    """Wall time from each step mark to the next (``--json`` only): where in a run the arms
    differ, e.g. at the trainer checkpoints' steps or evenly over all."""
    children_cpu_ms_per_step: float = 0.0
    """CPU time per step of the processes below this one (the trainer process, the
    generation worker), alive at the first step mark."""
    machine_busy_ms_per_step: float = 0.0
    """CPU time per step of the whole machine, every core, kernel included (``/proc/stat``):
    what the run and anything else running took."""
    machine_idle_share: float = 0.0
    """The share of the machine's core time that was idle (or waiting on I/O) in the timed
    window: above zero, the run did not keep every core busy."""


def vm_hwm_mib(pid: int) -> float:
    """Peak resident set of ``pid`` in MiB (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0


def process_cpu_s() -> float:
    """User + system CPU seconds of this process, all threads."""
    times = os.times()
    return times.user + times.system


def machine_cpu_ticks() -> tuple[int, int]:
    """Busy and idle (idle + iowait) clock ticks of every core since boot (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, idle


def processes_cpu_ticks(pids: Sequence[int]) -> int:
    """User + system clock ticks of ``pids`` (a process that is gone counts 0)."""
    ticks = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ticks += sum(int(v) for v in stat.rsplit(")", 1)[1].split()[11:13])
    return ticks


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, found by scanning ``/proc``."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may hold spaces; the ppid follows its closing parenthesis.
        parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        children = [child for child, parent in parent_of.items() if parent == current]
        found += children
        frontier += children
    return found


MEMORY_SAMPLE_STEPS = 10
"""Peaks (VmHWM) are high-water marks, so sampling every few steps loses nothing
while the processes live, and keeps the /proc scan out of the timed loop."""


def recipe_config(run_dir: Path, *overrides: str) -> RunConfig:
    return load_run_config(
        RECIPE,
        [
            f"logging.log_dir={run_dir / 'logs'}",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            *overrides,
        ],
    )


def warm_model(tmp: Path) -> tuple[Path, dict[str, float]]:
    """The recipe's warm-up, once; the warmed model is saved as a model directory."""
    config = recipe_config(tmp / "warmup", f"model.path={tmp / 'base_model'}")
    torch.set_num_threads(1)
    model, tokenizer = load_model_dir(
        ensure_model_dir(Path(config.model.path), build_default=True, seed=config.seed)
    )
    dataset = build_dataset(config.dataset, vocab_size=len(tokenizer), seed=config.seed)
    warm = config.trainer.warmup
    report = supervised_warmup(
        model,
        tokenizer,
        warmup_examples(dataset),
        steps=warm.steps,
        batch_size=warm.batch_size,
        learning_rate=warm.learning_rate,
        seed=config.seed,
    )
    path = tmp / "warm_model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, {"steps": warm.steps, "seconds": report.seconds, "final_loss": report.final_loss}


def run_arm(
    arm: str,
    run_dir: Path,
    model_dir: Path,
    steps: int,
    overrides: Sequence[str] = (),
    *,
    journal: bool = True,
    probes: bool = True,
    profile: Path | None = None,
) -> RunResult:
    """One timed run of ``arm``. ``probes``: wrap the journal's methods to measure its CPU and
    its queued-to-durable latency (False: the journal's code runs unwrapped, so the run's
    steps/s carry no probe cost; those columns then read 0)."""
    journaled = arm == "snapshots" and journal
    config = recipe_config(
        run_dir,
        *overrides,
        f"model.path={model_dir}",
        "model.build_default=false",
        "trainer.warmup.steps=0",
        f"grpo.max_num_steps={steps}",
        # The snapshots arm takes the recipe's schedule (or a --set one); none has no
        # periodic snapshot.
        *(() if arm == "snapshots" else ("rollout_checkpointing.interval_s=1e9",)),
        f"rollout_checkpointing.journal.enabled={'true' if journaled else 'false'}",
    )
    setup = prepare(config)
    marks: list[tuple[float, int, float, float]] = []
    ticks: list[tuple[int, int, int]] = []
    """(machine busy, machine idle, children) clock ticks at each step mark."""
    children: list[int] = []
    result = RunResult(arm, 0, 0.0, 0.0, 0.0, 0, 0.0)
    load_start = os.getloadavg()[0]

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        if not children:
            children.extend(descendants(os.getpid()))
        tokens = setup.tokens_generated()
        marks.append((time.perf_counter(), tokens, process_cpu_s(), time.thread_time()))
        ticks.append((*machine_cpu_ticks(), processes_cpu_ticks(children)))
        collector.counting = True
        result.rewards.append(metrics.get("reward_mean", float("nan")))
        result.accuracies.append(metrics.get("accuracy", float("nan")))
        result.journal = {k: v for k, v in metrics.items() if k.startswith("journal/")}
        if len(marks) % MEMORY_SAMPLE_STEPS == 1:
            result.parent_peak_mib = max(result.parent_peak_mib, vm_hwm_mib(os.getpid()))
            for pid in descendants(os.getpid()):
                peak = max(result.children_peak_mib.get(pid, 0.0), vm_hwm_mib(pid))
                result.children_peak_mib[pid] = peak

    originals = {name: getattr(checkpointer_module, name) for name in TIMED_STEPS}
    snapshot_profiler = cProfile.Profile() if profile is not None else None
    for name, function in originals.items():
        setattr(
            checkpointer_module,
            name,
            timed(function, result.snapshot_times[name], snapshot_profiler),
        )
    writer_cpu = WriterCpu(cProfile.Profile() if profile is not None else None)
    original_run = JournalWriter._run
    original_close = JournalProcessWriter.close
    journal_loop_cpu = JournalLoopCpu()
    durable_latency = DurableLatency()
    if probes:
        JournalWriter._run = writer_cpu.wrap(original_run)  # type: ignore[method-assign,assignment]
        JournalProcessWriter.close = writer_cpu.wrap_close(original_close)  # type: ignore[method-assign,assignment]
        journal_loop_cpu.install()
        durable_latency.install()
    collector = CollectorTime()
    gc.callbacks.append(collector)
    profiler = cProfile.Profile() if profile is not None else None
    try:
        if profiler is not None:
            profiler.enable()
        summary = asyncio.run(setup.run_pipeline(on_step=on_step))
    finally:
        if profiler is not None:
            profiler.disable()
        # The trainer process ends with its run: left running, each run's stayed alive
        # until the script ended and was summed in every later run's children peak.
        setup.close()
        if probes:
            JournalWriter._run = original_run  # type: ignore[method-assign]
            JournalProcessWriter.close = original_close  # type: ignore[method-assign]
            journal_loop_cpu.remove()
            durable_latency.remove()
        gc.callbacks.remove(collector)
        for name, function in originals.items():
            setattr(checkpointer_module, name, function)
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    if snapshot_profiler is not None and profile is not None and result.snapshot_times:
        snapshot_profiler.dump_stats(profile.with_suffix(".snapshots.prof"))
    if writer_cpu.profiler is not None and profile is not None and writer_cpu.seconds:
        writer_cpu.profiler.dump_stats(profile.with_suffix(".writer.prof"))
    (t0, n0, c0, l0), (t1, n1, c1, l1) = marks[0], marks[-1]
    result.steps = len(marks)
    result.seconds = t1 - t0
    result.steps_per_s = (len(marks) - 1) / (t1 - t0)
    result.tokens_per_s = (n1 - n0) / (t1 - t0)
    result.controller_cpu_ms_per_step = 1000 * (c1 - c0) / (len(marks) - 1)
    result.loop_cpu_ms_per_step = 1000 * (l1 - l0) / (len(marks) - 1)
    # The writer runs from the run's start to its end: per step of the whole run.
    result.writer_cpu_ms_per_step = 1000 * writer_cpu.seconds / len(marks)
    result.journal_loop_cpu_ms_per_step = 1000 * journal_loop_cpu.seconds / len(marks)
    result.durable_latency_ms = durable_latency.latencies_ms
    result.gc_passes_per_step = [n / (len(marks) - 1) for n in collector.passes]
    result.gc_ms_per_step = [1000 * t / (len(marks) - 1) for t in collector.seconds]
    result.snapshots_written = summary.snapshots_written
    started = result.snapshot_times["publish_snapshot"].started_at
    result.snapshots_timed = sum(t0 <= start <= t1 for start in started)
    result.load_average = (load_start, os.getloadavg()[0])
    result.step_seconds = [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    (busy0, idle0, kids0), (busy1, idle1, kids1) = ticks[0], ticks[-1]
    result.children_cpu_ms_per_step = 1000 * TICK_S * (kids1 - kids0) / (len(marks) - 1)
    result.machine_busy_ms_per_step = 1000 * TICK_S * (busy1 - busy0) / (len(marks) - 1)
    result.machine_idle_share = (idle1 - idle0) / max(1, busy1 - busy0 + idle1 - idle0)
    return result


def _journal_line(journal: dict[str, float]) -> str:
    if not journal:
        return ""
    return (
        f", journal: {journal['journal/seals_journaled']:.0f} seals "
        f"({journal['journal/seals_kept']:.0f} durable), {journal['journal/fsyncs']:.0f} fsyncs, "
        f"{journal['journal/bytes_written'] / 2**20:.1f} MiB"
    )


def _latency_line(latencies_ms: list[float]) -> str:
    if not latencies_ms:
        return ""
    ordered = sorted(latencies_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f", queued to durable: median {statistics.median(ordered):.1f} ms, "
        f"p99 {p99:.1f}, max {ordered[-1]:.1f} over {len(ordered)} records"
    )


def curve_summary(rewards: list[float], accuracies: list[float], window: int = 25) -> list[str]:
    lines = []
    for start in range(0, len(rewards), window):
        r = np.nanmean(rewards[start : start + window])
        a = np.nanmean(accuracies[start : start + window])
        lines.append(
            f"  steps {start:4d}-{start + window - 1:4d}: reward {r:.3f}  accuracy {a:6.1%}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=300,
        help="optimizer steps per timed run (300: ~12 s, so that the snapshots arm's 5 s "
        "periodic snapshots fall in it; at 100 none does)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="runs per arm (interleaved)")
    parser.add_argument(
        "--curve-steps", type=int, default=600, help="steps of the curve run (the recipe: 600)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="DOTPATH=VALUE",
        help="override the recipe for every run after the warm-up (repeatable), e.g. "
        "trainer.learning_rate=1e-3; with --rounds 0 this sweeps the recipe's learning",
    )
    parser.add_argument(
        "--journal",
        choices=("on", "off"),
        default="on",
        help="the seal journal in the snapshots arm (the none arm never has it)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a cProfile of each run's event loop thread to DIR/<round>_<arm>.prof",
    )
    parser.add_argument(
        "--probes",
        choices=("on", "off"),
        default="on",
        help="the journal's CPU and latency probes (off: the journal's methods run unwrapped, "
        "so the ratio carries no probe cost; the journal's CPU columns then read 0)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as name:
        tmp = Path(name)
        model_dir, warm = warm_model(tmp)
        print(
            f"warm-up: {warm['steps']:.0f} steps in {warm['seconds']:.1f}s, "
            f"final loss {warm['final_loss']:.3f}"
        )
        results: list[RunResult] = []
        for round_index in range(args.rounds):
            order = ARMS if round_index % 2 == 0 else ARMS[::-1]
            for arm in order:
                result = run_arm(
                    arm,
                    tmp / f"r{round_index}_{arm}",
                    model_dir,
                    args.steps,
                    args.set,
                    journal=args.journal == "on",
                    probes=args.probes == "on",
                    profile=_profile_path(args.profile, f"{round_index}_{arm}"),
                )
                results.append(result)
                print(
                    f"round {round_index} {arm:9s}: {result.steps_per_s:5.2f} steps/s "
                    f"{result.tokens_per_s:7.0f} tokens/s "
                    f"{result.controller_cpu_ms_per_step:5.1f} ms CPU/step (loop "
                    f"{result.loop_cpu_ms_per_step:5.1f}, journal writer "
                    f"{result.writer_cpu_ms_per_step:4.1f}, journal on the loop "
                    f"{result.journal_loop_cpu_ms_per_step:4.2f}) over "
                    f"{result.seconds:5.1f}s, children {result.children_cpu_ms_per_step:5.1f} "
                    f"ms CPU/step, machine busy {result.machine_busy_ms_per_step:5.1f} ms/step "
                    f"(idle {100 * result.machine_idle_share:4.1f}%), "
                    f"{result.snapshots_written} snapshots ({result.snapshots_timed} timed), load {result.load_average[0]:.1f}"
                    f"-{result.load_average[1]:.1f}, peak RSS parent "
                    f"{result.parent_peak_mib:.0f} MiB children "
                    f"{sum(result.children_peak_mib.values()):.0f} MiB"
                    + f", GC {sum(result.gc_ms_per_step):.2f} ms/step (oldest generation "
                    f"{result.gc_passes_per_step[2]:.2f} passes, {result.gc_ms_per_step[2]:.2f} ms)"
                    + _journal_line(result.journal)
                    + _latency_line(result.durable_latency_ms),
                    flush=True,
                )
        summary = _summarise(results, args.rounds) if args.rounds else {"ratios": []}
        for line in summary.get("lines", []):
            print(line)
        curve: dict[str, list[float]] = {}
        if args.curve_steps:
            result = run_arm("snapshots", tmp / "curve", model_dir, args.curve_steps, args.set)
            results.append(result)
            curve = {"reward": result.rewards, "accuracy": result.accuracies}
            print(f"reward curve ({args.curve_steps} steps after the warm-up, snapshots on):")
            for line in curve_summary(result.rewards, result.accuracies):
                print(line)
        parent = max(r.parent_peak_mib for r in results)
        children = max(sum(r.children_peak_mib.values()) for r in results)
        print(
            f"peak memory (sum of per-process peaks, one run): parent {parent:.0f} MiB + "
            f"children {children:.0f} MiB = {parent + children:.0f} MiB (goal < 2048 MiB)"
        )
        if args.json:
            payload = {
                "warmup": warm,
                "runs": [asdict(r) for r in results],
                "ratios": summary["ratios"],
                "peak_memory_mib": {"parent": parent, "children": children},
                "curve": curve,
            }
            print(json.dumps(payload))
    return 0


def _profile_path(directory: Path | None, name: str) -> Path | None:
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}.prof"


def _summarise(results: list[RunResult], rounds: int) -> dict[str, list]:
    lines = []
    medians = {}
    for arm in ARMS:
        mine = [r for r in results if r.arm == arm]
        medians[arm] = (
            statistics.median(r.steps_per_s for r in mine),
            statistics.median(r.tokens_per_s for r in mine),
            statistics.median(r.controller_cpu_ms_per_step for r in mine),
            statistics.median(r.loop_cpu_ms_per_step for r in mine),
            statistics.median(r.writer_cpu_ms_per_step for r in mine),
            statistics.median(r.journal_loop_cpu_ms_per_step for r in mine),
        )
        lines.append(
            f"median {arm:9s}: {medians[arm][0]:5.2f} steps/s {medians[arm][1]:7.0f} tokens/s "
            f"{medians[arm][2]:5.1f} ms controller CPU/step (event loop {medians[arm][3]:5.1f}, "
            f"journal writer {medians[arm][4]:4.1f}, journal on the loop {medians[arm][5]:4.2f})"
        )
    for name in TIMED_STEPS:
        times = [r.snapshot_times[name] for r in results if r.arm == "snapshots"]
        wall = [t for ts in times for t in ts.wall_s]
        cpu = [t for ts in times for t in ts.cpu_s]
        if wall:
            lines.append(
                f"{name} (after the cut, in a thread): median "
                f"{1000 * statistics.median(wall):.0f} ms wall, "
                f"{1000 * statistics.median(cpu):.0f} ms CPU, max {1000 * max(wall):.0f} ms "
                f"wall, over {len(wall)} snapshots"
            )
    ratios = []
    cpu_ratios = []
    loop_ratios = []
    for round_index in range(rounds):
        with_, without = (results[2 * round_index + k] for k in (0, 1))
        if with_.arm != "snapshots":
            with_, without = without, with_
        ratios.append(with_.steps_per_s / without.steps_per_s)
        cpu_ratios.append(with_.controller_cpu_ms_per_step / without.controller_cpu_ms_per_step)
        loop_ratios.append(with_.loop_cpu_ms_per_step / without.loop_cpu_ms_per_step)
    lines.append(
        "snapshots / none, train steps/s: per round "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; median of the rounds {statistics.median(ratios):.3f}"
        + f"; ratio of medians {medians['snapshots'][0] / medians['none'][0]:.3f} "
        f"(tokens/s {medians['snapshots'][1] / medians['none'][1]:.3f}); goal >= 0.99"
    )
    lines.append(
        "controller CPU per step, snapshots / none: "
        f"{medians['snapshots'][2] / medians['none'][2]:.3f} (ratio of medians); per round "
        + ", ".join(f"{r:.3f}" for r in cpu_ratios)
        + f"; median of the rounds {statistics.median(cpu_ratios):.3f}"
    )
    lines.append(
        "event loop CPU per step, snapshots / none: per round "
        + ", ".join(f"{r:.3f}" for r in loop_ratios)
        + f"; median of the rounds {statistics.median(loop_ratios):.3f}"
    )
    timed_snapshots = {
        arm: statistics.median(r.snapshots_timed for r in results if r.arm == arm) for arm in ARMS
    }
    lines.append(
        "snapshots published in the timed window, median per run: "
        f"snapshots {timed_snapshots['snapshots']:g}, none {timed_snapshots['none']:g}"
    )
    if timed_snapshots["snapshots"] <= timed_snapshots["none"]:
        lines.append(
            "  (no periodic snapshot fell in the timed window: the ratio measures the seal "
            "journal alone; a periodic snapshot falls due rollout_checkpointing.interval_s after "
            "the newest committed state, a trainer checkpoint's included, and the run must "
            "outlast it)"
        )
    loads = [load for r in results for load in r.load_average]
    lines.append(f"load average (1 min) over the runs: {min(loads):.1f}-{max(loads):.1f}")
    return {"lines": lines, "ratios": ratios, "cpu_ratios": cpu_ratios, "loop_ratios": loop_ratios}


if __name__ == "__main__":
    sys.exit(main())
