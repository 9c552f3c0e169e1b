"""Benchmark of the Ray actor pool gate (issue 15, "Recipes, tests and figures").

Runs the addition recipe in-process, side by side in one run, on one
private local Ray (``ray.address: local``), arms interleaved round by round
so a drift of the shared machine's load hits every arm:

- **local**: the local model gate, one worker process (the Ray instance idles);
- **ray-1**: the Ray pool gate with one generation actor;
- **ray-2**: the Ray pool gate with two generation actors;
- **recipe**: ``configs/grpo_addition_ray.yaml`` as it is (two actors and the
  trainer as a Ray actor), for its memory.

Every run starts from the same model (no warm-up: throughput, not learning)
and is timed between its first and last optimizer step, so actor start-up
and model loading are excluded: steps per second and response tokens per
second. Memory: the peak resident set (``VmHWM``) of this process and of
every process of its Ray (the GCS server, raylet, agents, the actors),
sampled at every step; the sum of the peaks bounds the peak of the whole
(they need not coincide).

Usage: python benchmarks/bench_ray_pool.py [--steps N] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import rollvault
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.parts import RolloutParts
from rollvault.gates.local_model import LocalModelGate
from rollvault.gates.ray_pool import RayPoolGate
from rollvault.recipes.async_grpo import prepare, train
from rollvault.recipes.ray_processes import descendants, marked_processes
from rollvault.recipes.ray_runtime import RaySession, ray_runtime

RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition_ray.yaml"
ARMS: dict[str, list[str]] = {
    "local": ["gate.kind=local_model", "trainer.placement=local"],
    "ray-1": ["gate.ray.num_actors=1", "trainer.placement=local"],
    "ray-2": ["gate.ray.num_actors=2", "trainer.placement=local"],
}


def _config(work: Path, name: str, steps: int, extra: list[str]) -> RunConfig:
    run = work / name
    return load_run_config(
        RECIPE,
        [
            f"grpo.max_num_steps={steps}",
            "trainer.warmup.steps=0",
            f"model.path={work / 'model'}",
            f"logging.log_dir={run / 'logs'}",
            f"checkpointing.checkpoint_dir={run / 'checkpoints'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            "ray.num_cpus=4",
            *extra,
        ],
    )


def _peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _run(config: RunConfig, session: RaySession) -> dict[str, Any]:
    prepared = prepare(config)
    times: list[float] = []
    first_tokens: list[int] = []
    peaks: dict[int, int] = {}

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        times.append(time.perf_counter())
        if not first_tokens:
            first_tokens.append(prepared.tokens_generated())
        gate = prepared.gates[0]
        if isinstance(gate, RayPoolGate):
            # This process and every process of its Ray (GCS, raylet, agents, actors).
            pids = {os.getpid(), *(p.pid for p in descendants(os.getpid()))}
            pids |= set(marked_processes(str(session.temp_dir)))
        else:
            # The local gate's arm: this process and its worker (the idle Ray is not its).
            assert isinstance(gate, LocalModelGate)
            pids = {os.getpid(), gate.worker_pid}
        for pid in pids:
            peaks[pid] = max(peaks.get(pid, 0), _peak_kib(pid))

    with prepared:  # its trainer process ends with the run, not with the benchmark
        asyncio.run(train(prepared, on_step=on_step))
    seconds = times[-1] - times[0]
    tokens = prepared.tokens_generated() - first_tokens[0]
    return {
        "steps_per_s": (len(times) - 1) / seconds,
        "tokens_per_s": tokens / seconds,
        "peak_rss_sum_mib": sum(peaks.values()) / 1024,
        "processes": len(peaks),
        "driver_peak_mib": peaks.get(os.getpid(), 0) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in [*ARMS, "recipe"]}
    with tempfile.TemporaryDirectory(prefix="rvbench_", dir="/tmp") as tmp:
        work = Path(tmp)
        anchor = _config(work, "ray_anchor", args.steps, [])
        with ray_runtime(anchor) as session:
            assert session is not None
            for round_number in range(args.rounds):
                order = list(ARMS) if round_number % 2 == 0 else list(reversed(ARMS))
                for name in order:
                    config = _config(work, f"{name}_{round_number}", args.steps, ARMS[name])
                    results[name].append(_run(config, session))
                    print(name, round_number, results[name][-1], flush=True)
            recipe = _config(work, "recipe", args.steps, [])
            results["recipe"].append(_run(recipe, session))
            print("recipe", results["recipe"][-1], flush=True)
    summary = {
        name: {
            key: statistics.median(run[key] for run in runs)
            for key in ("steps_per_s", "tokens_per_s", "peak_rss_sum_mib", "processes")
        }
        for name, runs in results.items()
    }
    if args.json:
        print(json.dumps({"runs": results, "median": summary}, indent=2))
        return
    for name, row in summary.items():
        print(
            f"{name:7s} steps/s {row['steps_per_s']:.2f}  tokens/s {row['tokens_per_s']:.0f}  "
            f"peak RSS (sum over {row['processes']:.0f} processes) {row['peak_rss_sum_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
