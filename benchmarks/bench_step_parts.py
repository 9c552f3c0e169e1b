"""CPU per GRPO step of each part the trainer process and the generation worker run (issue 17).

One process, one torch thread, the recipe's shape (16 prompts x 8 generations,
at most 6 new tokens, temperature 0.7), from ``--start`` weights: each step
runs, in order and each timed with ``time.thread_time`` (CPU of this thread,
so another job on the shared machine hardly moves it), what one step costs in
the pipeline's processes:

- worker: decode the ``Generate`` command, generate the batch, encode its reply;
- controller: decode the reply, build the canonical rows, ``step_samples``,
  encode ``TrainStep``; later decode the trainer's weights and encode
  ``LoadWeights`` (the relay of a weight version);
- trainer: decode ``TrainStep``, ``train_samples`` (forward, backward, clip,
  AdamW), export the weights (``weights_for_gate``) and encode them;
- worker: decode ``LoadWeights``, load them.

The messages are the real ones (:mod:`rollvault.gates.worker_protocol`,
:mod:`rollvault.training.trainer_protocol`); only the pipes are left out
(their cost is a copy of the bytes each way). Rewards are the addition
environment's, the advantages GRPO's (group mean and standard deviation), so
the trained policy moves as in a run. ``--cprofile DIR`` writes one profile
per part group (worker, trainer) for ``pstats``.

Run it against another tree with ``PYTHONPATH=<tree>/src``; alternate trees to
compare (CPU time, so a shared machine bends it little).

Usage: python benchmarks/bench_step_parts.py --start DIR [--steps 40] [--warmup 5]
       [--threads 1] [--cprofile DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

PROMPTS = 16
GENERATIONS = 8
MAX_NEW_TOKENS = 6
TEMPERATURE = 0.7
T = TypeVar("T")


class Parts:
    """CPU seconds per named part, per step."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.profiles: dict[str, cProfile.Profile] = {}
        self.recording = False
        self.profiling = False

    @contextmanager
    def part(self, name: str, group: str) -> Iterator[None]:
        profile = self.profiles.setdefault(group, cProfile.Profile()) if self.profiling else None
        if profile is not None and self.recording:
            profile.enable()
        began = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - began
            if profile is not None and self.recording:
                profile.disable()
            if self.recording:
                self.seconds[name].append(spent)

    def timed(self, name: str, group: str, call: Callable[..., T], *args: Any) -> T:
        with self.part(name, group):
            return call(*args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_parts_") as name:
        model_dir = Path(name) / "model"
        shutil.copytree(args.start, model_dir)  # the start weights stay untouched
        parts = run(model_dir, args)
    rows = summary(parts)
    for line in rows:
        print(line)
    if args.cprofile:
        out = Path(args.cprofile)
        out.mkdir(parents=True, exist_ok=True)
        for group, profile in parts.profiles.items():
            profile.dump_stats(out / f"{group}.prof")
        print(f"profiles in {out}")
    if args.json:
        print(json.dumps({k: statistics.median(v) for k, v in parts.seconds.items()}))
    return 0


def run(model_dir: Path, args: argparse.Namespace) -> Parts:
    from rollvault.controller.loop.trainer import TrainBatch
    from rollvault.gates import worker_protocol as wp
    from rollvault.gates.causal_lm import load_tokenizer
    from rollvault.gates.generation_worker import GenerationEngine
    from rollvault.tasks.addition import AdditionEnvironment
    from rollvault.tasks.addition.dataset import AdditionPromptDataset
    from rollvault.training import trainer_protocol as tp
    from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer, step_samples
    from rollvault.training.model_store import load_model_dir

    tokenizer = load_tokenizer(model_dir)
    eos = int(tokenizer.eos_token_id)
    settings = wp.WorkerSettings(
        model_path=str(model_dir),
        temperature=TEMPERATURE,
        stop_token_ids=[eos],
        pad_token_id=int(tokenizer.pad_token_id),
    )
    engine = GenerationEngine(settings)
    model, _ = load_model_dir(model_dir)
    trainer = GrpoTrainer(
        model,
        pad_token_id=int(tokenizer.pad_token_id),
        settings=GrpoSettings(learning_rate=2e-4, temperature=TEMPERATURE, grad_clip=1.0),
    )
    environment = AdditionEnvironment()
    loop = asyncio.new_event_loop()
    steps = args.warmup + args.steps
    dataset = AdditionPromptDataset(steps * PROMPTS, seed=0)
    parts = Parts()
    parts.profiling = bool(args.cprofile)
    # Version 0: the worker loads the trainer's weights as in a run.
    engine.load_weights(wp.LoadWeights(version=0, weights=trainer.weights_for_gate()))
    rewards: list[float] = []
    zero_rows: list[float] = []
    suffix_tokens: list[int] = []
    for step in range(steps):
        parts.recording = step >= args.warmup
        data = [dataset[step * PROMPTS + p] for p in range(PROMPTS)]
        prompt_ids = [
            list(tokenizer(d["prompt_text"], add_special_tokens=False).input_ids) for d in data
        ]
        command = wp.Generate(
            requests=[
                wp.GenerationRequest(
                    request_id=p * GENERATIONS + g,
                    prompt_ids=prompt_ids[p],
                    seed=1_000_003 * step + 101 * p + g,
                )
                for p in range(PROMPTS)
                for g in range(GENERATIONS)
            ],
            max_new_tokens=MAX_NEW_TOKENS,
        )
        raw = wp.encode(command)
        # -- worker: one batch
        decoded = parts.timed("worker: decode Generate", "worker", wp.decode_command, raw)
        assert isinstance(decoded, wp.Generate)
        generated = parts.timed("worker: generate", "worker", engine.generate, decoded)
        reply = parts.timed("worker: encode Generated", "worker", wp.encode, generated)
        # -- controller: the results, the canonical rows, the step's samples
        result = parts.timed("controller: decode Generated", "controller", wp.decode_reply, reply)
        assert isinstance(result, wp.Generated)
        batch, step_reward = canonical_batch(
            step,
            data,
            prompt_ids,
            result.results,
            environment,
            tokenizer,
            loop,
            TrainBatch,
        )
        rewards.append(step_reward)
        flat = [np.asarray(row["advantages"]) for row in batch.rows.values()]
        zero_rows.append(sum(not a.any() for a in flat) / len(flat))
        suffix_tokens.append(sum(len(r.token_ids) for r in result.results))
        samples = parts.timed("controller: step_samples", "controller", step_samples, batch)
        train_raw = parts.timed(
            "controller: encode TrainStep",
            "controller",
            tp.encode,
            tp.TrainStep(samples=samples),
        )
        # -- trainer: the step, then the new version's weights
        train_command = parts.timed(
            "trainer: decode TrainStep", "trainer", tp.decode_command, train_raw
        )
        assert isinstance(train_command, tp.TrainStep)
        parts.timed(
            "trainer: train_samples",
            "trainer",
            trainer.train_samples,
            train_command.samples,
        )
        weights = parts.timed("trainer: weights_for_gate", "trainer", trainer.weights_for_gate)
        weights_raw = parts.timed(
            "trainer: encode Weights", "trainer", tp.encode, tp.Weights(weights=weights)
        )
        # -- controller: relay the version to the worker
        relayed = parts.timed(
            "controller: decode Weights", "controller", tp.decode_reply, weights_raw
        )
        assert isinstance(relayed, tp.Weights)
        load_raw = parts.timed(
            "controller: encode LoadWeights",
            "controller",
            wp.encode,
            wp.LoadWeights(version=step + 1, weights=relayed.weights),
        )
        # -- worker: load it
        load = parts.timed("worker: decode LoadWeights", "worker", wp.decode_command, load_raw)
        assert isinstance(load, wp.LoadWeights)
        parts.timed("worker: load_weights", "worker", engine.load_weights, load)
    loop.close()
    print(
        f"rows with all-zero advantages: {np.mean(zero_rows):.2f} of a batch; "
        f"response tokens per batch: {np.mean(suffix_tokens):.0f}"
    )
    window = max(len(rewards) // 4, 1)
    print(
        "reward per",
        window,
        "steps:",
        " ".join(f"{np.mean(rewards[i : i + window]):.3f}" for i in range(0, len(rewards), window)),
    )
    return parts


def canonical_batch(
    step: int,
    data: list[Any],
    prompt_ids: list[list[int]],
    results: list[Any],
    environment: Any,
    tokenizer: Any,
    loop: asyncio.AbstractEventLoop,
    batch_type: Any,
) -> tuple[Any, float]:
    """The finalizer's rows for the batch (reward, GRPO advantages with std scaling)."""
    from rollvault.training.synthetic_batches import response_row, step_group

    eos = int(tokenizer.eos_token_id)
    rows: dict[str, Any] = {}
    groups = []
    rewards_all: list[float] = []
    for p, datum in enumerate(data):
        group = results[p * GENERATIONS : (p + 1) * GENERATIONS]
        rewards = []
        for r in group:
            ids = r.token_ids[:-1] if r.finished and r.token_ids[-1] == eos else r.token_ids
            text = tokenizer.decode(ids, skip_special_tokens=False)
            score = loop.run_until_complete(
                environment.score_text(datum, text, finished=r.finished)
            )
            rewards.append(score.reward)
        rewards_all += rewards
        mean, std = float(np.mean(rewards)), float(np.std(rewards))
        entry = step_group(step, p)
        groups.append(entry)
        for g, r in enumerate(group):
            advantage = (rewards[g] - mean) / (std + 1e-6) if std > 0 else 0.0
            rows[f"{entry.group_id}_g{g}"] = {
                **response_row(
                    prompt_ids[p], r.token_ids, r.logprobs, advantage=advantage, reward=rewards[g]
                ),
                "correct": rewards[g] >= 1.0,
            }
    batch = batch_type(step=step, groups=groups, rows=rows, generations_per_group=GENERATIONS)
    return batch, float(np.mean(rewards_all))


def summary(parts: Parts) -> list[str]:
    lines = ["part: median ms CPU per step (mean)"]
    totals: dict[str, float] = defaultdict(float)
    for name, values in parts.seconds.items():
        median = 1000 * statistics.median(values)
        totals[name.split(":")[0]] += median
        lines.append(f"  {name:34s} {median:8.2f} ({1000 * statistics.mean(values):.2f})")
    lines += [f"  total {side:28s} {ms:8.2f}" for side, ms in totals.items()]
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--start", required=True, help="a model directory (copied, not changed)")
    parser.add_argument("--steps", type=int, default=40, help="measured steps")
    parser.add_argument("--warmup", type=int, default=5, help="steps run first, not measured")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--cprofile", metavar="DIR", help="write worker/trainer/controller profiles"
    )
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
