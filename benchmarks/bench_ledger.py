"""Benchmark of the recovery ledger at production scale (issue 2, section 4).

Default size: 1,024 prompt groups x 16 siblings x 2 attempts per sibling
(every sibling's first attempt fails, its retry seals). Reports:

- ledger mutations per second, per operation and overall, with every call
  inside one held mutation section (the ledger's own cost), and side by side
  the same workload with one cut section per call (ledger + cut);
- ``state_dict``, and the sidecar round trip: ``build_rollout_recovery_state``
  (which contains the ledger's state) + encode + decode-and-parse; then
  ``from_state_dict`` (a restore) separately;
- the sidecar's size in bytes;
- the ledger's memory, measured with tracemalloc in a separate build;
- how fast this machine runs Python (a bare loop), to compare figures across machines.

Usage: python benchmarks/bench_ledger.py [--groups N] [--siblings N] [--repeat N]
       [--cpu-clock] [--json]
Timings are the best of ``--repeat`` runs (a noisy shared machine inflates,
never deflates, a run), taken with the garbage collector paused except where
a figure says "garbage collector on".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from rollvault.cut import DataPlaneMutationCut
from rollvault.rollout_recovery import (
    ParsedRolloutRecoveryState,
    RolloutRecoveryLedger,
    build_rollout_recovery_state,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
)

Step = Callable[[], object]

_clock: Callable[[], float] = time.perf_counter
"""Wall time by default; ``--cpu-clock`` switches to this process's CPU time, which a
machine shared with other jobs inflates much less (they take cores, not our CPU seconds)."""


class Workload:
    """The ledger calls of the benchmark, phase by phase, with their inputs precomputed."""

    def __init__(
        self, ledger: RolloutRecoveryLedger, cut: DataPlaneMutationCut, groups: int, siblings: int
    ) -> None:
        self.ledger = ledger
        self.cut = cut
        self.groups = groups
        self.siblings = siblings
        self.group_ids: list[str] = []

    def reserve(self) -> list[Step]:
        return [partial(self._reserve, index) for index in range(self.groups)]

    def _reserve(self, index: int) -> None:
        record = self.ledger.reserve_group(
            self.cut,
            prompt_id=str(index),
            prompt_payload={"idx": index, "task_name": "math"},
            expected_generations=self.siblings,
            target_step=index // 64,
            start_weight_version=0,
        )
        self.group_ids.append(record.group_id)

    def dispatch(self) -> list[Step]:
        return [
            partial(self.ledger.mark_group_dispatched, self.cut, group_id)
            for group_id in self.group_ids
        ]

    def _gate_ids(self) -> list[tuple[str, int, str]]:
        return [
            (group_id, index, gate_id)
            for group_id in self.group_ids
            for index, gate_id in enumerate(self.ledger.get_group(group_id).gate_rollout_ids)
        ]

    def fail(self) -> list[Step]:
        return [
            partial(
                self.ledger.mark_sibling_failed,
                self.cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate_id,
                reason="gate timeout",
            )
            for group_id, index, gate_id in self._gate_ids()
        ]

    def retry(self) -> list[Step]:
        return [
            partial(self.ledger.prepare_incomplete_retry, self.cut, group_id)
            for group_id in self.group_ids
        ]

    def seal(self) -> list[Step]:
        return [
            partial(
                self.ledger.mark_sibling_sealed,
                self.cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate_id,
                receipt={
                    "gate_rollout_id": gate_id,
                    "staging_keys": [f"{gate_id}/turn0"],
                    "row_digests": [{"length": 512, "digest": "9f" * 16}],
                },
                reward=float(index % 2),
                mask_sample=False,
            )
            for group_id, index, gate_id in self._gate_ids()
        ]

    def finalize(self) -> list[Step]:
        return [
            partial(self.ledger.mark_finalization_started, self.cut, group_id)
            for group_id in self.group_ids
        ]

    def discard(self) -> list[Step]:
        return [
            partial(self.ledger.discard_group, self.cut, group_id) for group_id in self.group_ids
        ]


BUILD_PHASES = ("reserve", "dispatch", "fail", "retry", "dispatch", "seal")
DRAIN_PHASES = ("finalize", "discard")


async def _run_held(cut: DataPlaneMutationCut, steps: list[Step]) -> float:
    """Run every step inside one mutation section; return the seconds taken."""
    async with cut.mutation():
        start = _clock()
        for step in steps:
            step()
        return _clock() - start


async def _run_per_call(cut: DataPlaneMutationCut, steps: list[Step]) -> float:
    """Run every step in its own mutation section; return the seconds taken."""
    start = _clock()
    for step in steps:
        async with cut.mutation():
            step()
    return _clock() - start


@contextmanager
def _gc_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _phases(
    workload: Workload, phases: tuple[str, ...], per_call: bool
) -> dict[str, list[float]]:
    """Return phase -> [seconds, calls], accumulated over repeated phase names."""
    runner = _run_per_call if per_call else _run_held
    timings: dict[str, list[float]] = {}
    for phase in phases:
        async with workload.cut.mutation():
            steps = getattr(workload, phase)()
        seconds = await runner(workload.cut, steps)
        entry = timings.setdefault(phase, [0.0, 0])
        entry[0] += seconds
        entry[1] += len(steps)
    return timings


async def _one_run(
    groups: int, siblings: int, per_call: bool, gc_on: bool = False
) -> tuple[dict[str, list[float]], Workload]:
    workload = Workload(RolloutRecoveryLedger(), DataPlaneMutationCut(), groups, siblings)
    if gc_on:
        gc.collect()
        timings = await _phases(workload, BUILD_PHASES, per_call)
    else:
        with _gc_paused():
            timings = await _phases(workload, BUILD_PHASES, per_call)
    return timings, workload


def _sidecar_round_trip(ledger: RolloutRecoveryLedger) -> dict[str, Any]:
    with _gc_paused():
        t0 = _clock()
        state = ledger.state_dict()
        t1 = _clock()
        sidecar = build_rollout_recovery_state(
            ledger, batch_shortfall={3: 1}, sampler_stamps_target_steps=True
        )
        t2 = _clock()
        data = encode_rollout_recovery_state(sidecar)
        t3 = _clock()
        parsed = decode_rollout_recovery_state(data)
        t4 = _clock()
        restored = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
        t5 = _clock()
        # Absent before issue 16: the same script also measures older commits.
        loaded = (
            asyncio.run(_load_parsed(parsed))
            if hasattr(RolloutRecoveryLedger, "load_parsed_state")
            else restored
        )
        t6 = _clock()
    if restored.state_dict() != state or loaded.state_dict() != state:
        raise SystemExit("round trip changed the ledger state")
    return {
        "state_dict_s": t1 - t0,
        "build_sidecar_s": t2 - t1,
        "encode_s": t3 - t2,
        "decode_parse_s": t4 - t3,
        "from_state_dict_s": t5 - t4,
        "load_parsed_state_s": t6 - t5,
        "round_trip_s": t4 - t1,
        "sidecar_bytes": len(data),
    }


async def _load_parsed(parsed: ParsedRolloutRecoveryState) -> RolloutRecoveryLedger:
    """What a restore does: the records from the parse's checked state, no second check."""
    ledger, cut = RolloutRecoveryLedger(), DataPlaneMutationCut()
    async with cut.mutation():
        ledger.load_parsed_state(cut, parsed)
    return ledger


def _ledger_memory(groups: int, siblings: int) -> int:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _, workload = asyncio.run(_one_run(groups, siblings, per_call=False))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del workload
    return after - before


def _python_loop_ns() -> float:
    """Nanoseconds per iteration of a bare Python loop: how fast this machine runs Python."""
    best = float("inf")
    for _ in range(3):
        total = 0
        start = _clock()
        for number in range(2_000_000):
            total += number
        best = min(best, _clock() - start)
    return best / 2_000_000 * 1e9


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: min(run[key] for run in runs) for key in runs[0]}


def measure(groups: int, siblings: int, repeat: int) -> dict[str, Any]:
    held_runs: list[dict[str, list[float]]] = []
    per_call_runs: list[dict[str, list[float]]] = []
    gc_runs: list[dict[str, list[float]]] = []
    trips: list[dict[str, Any]] = []
    drains: list[float] = []
    for _ in range(repeat):
        held, workload = asyncio.run(_one_run(groups, siblings, per_call=False))
        per_call, _ = asyncio.run(_one_run(groups, siblings, per_call=True))
        with_gc, _ = asyncio.run(_one_run(groups, siblings, per_call=False, gc_on=True))
        gc_runs.append(with_gc)
        held_runs.append(held)
        per_call_runs.append(per_call)
        trips.append(_sidecar_round_trip(workload.ledger))
        drain = asyncio.run(_drain(workload))
        drains.append(drain)
    phases = {
        phase: {
            "calls": int(held_runs[0][phase][1]),
            "seconds": min(run[phase][0] for run in held_runs),
        }
        for phase in held_runs[0]
    }
    held_total = min(sum(entry[0] for entry in run.values()) for run in held_runs)
    per_call_total = min(sum(entry[0] for entry in run.values()) for run in per_call_runs)
    gc_total = min(sum(entry[0] for entry in run.values()) for run in gc_runs)
    calls = int(sum(entry[1] for entry in held_runs[0].values()))
    # Attempt-level changes: each reserve and retry mints `siblings` attempts, each
    # dispatch moves `siblings` attempts, each fail or seal moves one.
    attempt_changes = 6 * groups * siblings
    return {
        "groups": groups,
        "siblings": siblings,
        "attempts_per_sibling": 2,
        "mutations": calls,
        "mutations_per_s_held_cut": calls / held_total,
        "mutations_per_s_cut_per_call": calls / per_call_total,
        "mutations_per_s_held_cut_gc_on": calls / gc_total,
        "cut_per_call_slowdown": per_call_total / held_total,
        "attempt_changes_per_s_held_cut": attempt_changes / held_total,
        "phases": {
            name: {**entry, "per_s": entry["calls"] / entry["seconds"]}
            for name, entry in phases.items()
        },
        "finalize_discard_per_s": 2 * groups / min(drains),
        **_best(trips),
        "ledger_memory_bytes": _ledger_memory(groups, siblings),
        "python_loop_ns_per_iteration": _python_loop_ns(),
    }


async def _drain(workload: Workload) -> float:
    with _gc_paused():
        timings = await _phases(workload, DRAIN_PHASES, per_call=False)
    if len(workload.ledger):
        raise SystemExit("drain left groups in the ledger")
    return sum(entry[0] for entry in timings.values())


def _table(result: dict[str, Any]) -> str:
    rows = [
        ("size", f"{result['groups']} groups x {result['siblings']} siblings x 2 attempts"),
        ("mutations in build", f"{result['mutations']:,}"),
        ("mutations/s (one held cut section)", f"{result['mutations_per_s_held_cut']:,.0f}"),
        (
            "mutations/s (held, garbage collector on)",
            f"{result['mutations_per_s_held_cut_gc_on']:,.0f}",
        ),
        ("mutations/s (cut section per call)", f"{result['mutations_per_s_cut_per_call']:,.0f}"),
        ("  per-call cut / held cut time", f"{result['cut_per_call_slowdown']:.2f}x"),
        (
            "attempt changes/s (held cut section)",
            f"{result['attempt_changes_per_s_held_cut']:,.0f}",
        ),
    ]
    for name, entry in result["phases"].items():
        rows.append((f"  {name} ({entry['calls']:,} calls)", f"{entry['per_s']:,.0f}/s"))
    rows += [
        ("finalize+discard/s", f"{result['finalize_discard_per_s']:,.0f}"),
        ("state_dict", f"{result['state_dict_s'] * 1e3:.1f} ms"),
        ("build_rollout_recovery_state", f"{result['build_sidecar_s'] * 1e3:.1f} ms"),
        ("encode (checks the envelope)", f"{result['encode_s'] * 1e3:.1f} ms"),
        ("decode + parse", f"{result['decode_parse_s'] * 1e3:.1f} ms"),
        ("round trip: build+encode+decode/parse", f"{result['round_trip_s'] * 1e3:.1f} ms"),
        ("from_state_dict (checks again)", f"{result['from_state_dict_s'] * 1e3:.1f} ms"),
        ("load_parsed_state (restore)", f"{result['load_parsed_state_s'] * 1e3:.1f} ms"),
        ("sidecar size", f"{result['sidecar_bytes']:,} bytes"),
        ("ledger memory (tracemalloc)", f"{result['ledger_memory_bytes'] / 2**20:.1f} MiB"),
        ("machine: bare Python loop", f"{result['python_loop_ns_per_iteration']:.0f} ns/iteration"),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--siblings", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time with the process's CPU time instead of wall time (for a loaded machine)",
    )
    args = parser.parse_args(argv)
    if args.cpu_clock:
        global _clock
        _clock = time.process_time
    result = measure(args.groups, args.siblings, args.repeat)
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
