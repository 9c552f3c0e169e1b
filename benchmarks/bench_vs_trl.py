"""rollvault against a synchronous TRL GRPO loop on the same work (issue 17).

Both sides train the addition recipe (``configs/grpo_addition.yaml``) from the
same start weights with the same reward function and the same
hyperparameters: 16 prompts x 8 generations per step, temperature 0.7,
``top_k=0``, ``top_p=1.0``, at most 6 new tokens, learning rate 2e-4
constant, no KL, gradient clip 1.0, AdamW without weight decay, clip epsilon
0.2, group rewards scaled by their standard deviation, the loss normalized by
the batch's token count (TRL's ``loss_type="dapo"``, its default, is
rollvault's normalization).

- **Start weights**: the recipe's own model after its supervised warm-up and
  ``--prepare-rl-steps`` RL steps of rollvault (default 100), exported as a
  Hugging Face model directory (the recipe's ``final_model/``). Built once,
  in a process of its own, before any timed run; both sides load it.
- **Reward**: :class:`rollvault.tasks.addition.AdditionEnvironment` on both
  sides (1.0 for the exact answer plus 0.1 for a 1-3 digit answer the model
  ended with eos). TRL's reward function decodes its completion ids the way
  the local model gate does (without the stop token, special tokens kept).
- **rollvault**: the recipe as ``rollvault run`` runs it (snapshots on, every
  5 s, and trainer checkpoints every 50 steps), in-process in a child:
  ``prepare`` then ``train``, with an ``on_step`` hook that records time,
  reward and tokens.
- **TRL**: ``GRPOTrainer`` with ``GRPOConfig(per_device_train_batch_size=128,
  num_generations=8, max_completion_length=6, temperature=0.7, top_k=0,
  top_p=1.0, learning_rate=2e-4, beta=0.0, lr_scheduler_type="constant",
  max_grad_norm=1.0, use_cpu=True)`` and a callback recording the same.
  torch keeps its default thread count there (TRL is synchronous: its one
  process may use both cores); rollvault's processes set theirs themselves.

Every run is a child process (``--side``) of this script, which samples the
CPU time of every process below it (``psutil``, every 0.2 s; the exact total
comes from ``getrusage(RUSAGE_CHILDREN)``). Sides alternate ABBA in paired
rounds, so a drift of the shared machine's load hits both; the figure is the
per-round ratio (rollvault / TRL) and its median. Steps/s is timed from the
first to the last optimizer step (steady state) and, separately, over the
whole child process (start-up included: imports, model load, worker spawn).

``--hidden-size 512 --num-layers 4`` runs the same comparison on a larger
model of the same architecture (built here, warmed up by rollvault's recipe).

TRL is not a rollvault dependency: install the ``bench`` extra first,
``pip install -e '.[bench]'`` (``trl==1.16.0``, with ``accelerate`` and
``datasets``); ``make bench-vs-trl`` does it in the project's venv.

Usage: python benchmarks/bench_vs_trl.py [--steps 200] [--rounds 3]
       [--prepare-rl-steps 100] [--hidden-size H --num-layers L] [--set DOTPATH=VALUE]
       [--start DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RECIPE = Path(__file__).resolve().parent.parent / "src/rollvault/configs/grpo_addition.yaml"
SIDES = ("rollvault", "trl")
PROMPTS_PER_STEP = 16
GENERATIONS = 8
CPU_SAMPLE_S = 0.2


# -- results --------------------------------------------------------------------------------


@dataclass
class SideResult:
    """What one child run measured of itself (written as JSON to ``--out``)."""

    side: str
    steps: int
    step_times: list[float]
    """``time.time()`` at the end of every optimizer step."""
    rewards: list[float]
    tokens: list[int]
    """Rollout (response) tokens of each step's batch, stop tokens included."""
    started: float
    """``time.time()`` when the child's ``main`` began (before importing torch)."""
    finished: float
    threads: int
    loop_cpu: list[float] = field(default_factory=list)
    """rollvault: ``time.thread_time()`` of the event loop's thread at every step's end
    (the controller's CPU, trainer excluded with ``trainer.placement=process``)."""


@dataclass
class RunResult:
    side: str
    steps: int
    steady_s: float
    total_s: float
    steps_per_s: float
    total_steps_per_s: float
    tokens_per_s: float
    cpu_s: float
    cores_used: float
    """CPU seconds of every process of the run / its wall seconds."""
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    steady_cpu_ms_per_step: dict[str, float] = field(default_factory=dict)
    """Per kind of process: CPU between the first and the last optimizer step (each
    process's sampled CPU interpolated at both), per step: start-up and shutdown excluded."""
    rewards: list[float] = field(default_factory=list)
    loop_cpu_per_step_ms: float = float("nan")
    """rollvault: the event loop thread's CPU per step over the steady window (a load on
    the machine stretches wall time, hardly CPU time: comparable across rounds)."""


# -- the child: one side ----------------------------------------------------------------------


def recipe_config(run_dir: Path, start: Path, steps: int, overrides: Sequence[str]) -> Any:
    from rollvault.config.loading import load_run_config

    return load_run_config(
        RECIPE,
        [
            f"logging.log_dir={run_dir / 'logs'}",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            f"model.path={start}",
            "model.build_default=false",
            f"grpo.max_num_steps={steps}",
            *overrides,
        ],
    )


def run_rollvault(
    run_dir: Path, start: Path, steps: int, overrides: Sequence[str], profile: str | None = None
) -> SideResult:
    import torch

    from rollvault.recipes.async_grpo import prepare, train

    config = recipe_config(run_dir, start, steps, ["trainer.warmup.steps=0", *overrides])
    setup = prepare(config)
    times: list[float] = []
    rewards: list[float] = []
    tokens: list[int] = []
    loop_cpu: list[float] = []

    def on_step(_parts: object, metrics: dict[str, float]) -> None:
        times.append(time.time())
        loop_cpu.append(time.thread_time())
        rewards.append(metrics.get("reward_mean", float("nan")))
        tokens.append(int(metrics.get("response_tokens", 0)))

    with setup:  # its trainer process ends with the run
        if profile:
            # cProfile sees the thread it runs in: the event loop (the controller's work).
            import cProfile

            with cProfile.Profile() as profiler:
                asyncio.run(train(setup, on_step=on_step))
            profiler.dump_stats(profile)
        else:
            asyncio.run(train(setup, on_step=on_step))
    return SideResult(
        "rollvault",
        len(times),
        times,
        rewards,
        tokens,
        0.0,
        0.0,
        torch.get_num_threads(),
        loop_cpu,
    )


def addition_reward(tokenizer: Any) -> Any:
    """The addition environment's reward over TRL's completion ids (see the module docstring)."""
    from rollvault.tasks.addition import AdditionEnvironment

    environment = AdditionEnvironment()
    eos = {int(tokenizer.eos_token_id)}
    loop = asyncio.new_event_loop()

    def reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **kw: Any
    ) -> list[float]:
        scores = []
        for prompt, ids, answer in zip(prompts, completion_ids, kw["answer"], strict=True):
            finished = bool(ids) and ids[-1] in eos
            text = tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
            datum = {"prompt_text": prompt, "extra_env_info": {"answer": answer}}
            score = loop.run_until_complete(environment.score_text(datum, text, finished=finished))
            scores.append(score.reward)
        return scores

    reward.__name__ = "addition"
    return reward


def run_trl(
    run_dir: Path, start: Path, steps: int, overrides: Sequence[str], threads: int = 0
) -> SideResult:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollvault.gates.causal_lm import load_causal_lm, load_tokenizer
    from rollvault.tasks.addition.dataset import AdditionPromptDataset

    if overrides:
        raise SystemExit("--set applies to rollvault's recipe; TRL has no equivalent here")
    if threads:
        torch.set_num_threads(threads)
    prompts = AdditionPromptDataset(steps * PROMPTS_PER_STEP, seed=0)
    rows = [prompts[i] for i in range(len(prompts))]
    dataset = Dataset.from_list(
        [{"prompt": r["prompt_text"], "answer": r["extra_env_info"]["answer"]} for r in rows]
    )
    tokenizer = load_tokenizer(start)
    model = load_causal_lm(start)
    config = GRPOConfig(
        output_dir=str(run_dir / "trl"),
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=6,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        learning_rate=2e-4,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        epsilon=0.2,
        beta=0.0,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        disable_tqdm=True,
    )
    times: list[float] = []
    rewards: list[float] = []
    tokens: list[int] = []

    class Record(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                times.append(time.time())
                rewards.append(float(logs["reward"]))
                length = float(logs.get("completions/mean_length", 0.0))
                tokens.append(round(length * PROMPTS_PER_STEP * GENERATIONS))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[addition_reward(tokenizer)],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Record()],
    )
    trainer.train()
    return SideResult("trl", len(times), times, rewards, tokens, 0.0, 0.0, torch.get_num_threads())


def child_main(args: argparse.Namespace) -> int:
    started = time.time()
    run_dir, start = Path(args.run_dir), Path(args.start)
    if args.side == "rollvault":
        result = run_rollvault(run_dir, start, args.steps, args.set, args.cprofile)
    else:
        result = run_trl(run_dir, start, args.steps, args.set, args.trl_threads)
    result.started, result.finished = started, time.time()
    Path(args.out).write_text(json.dumps(asdict(result)))
    return 0


# -- start weights ----------------------------------------------------------------------------


def prepare_start(args: argparse.Namespace) -> int:
    """Warm up the recipe's model (or a larger one) and train it ``--prepare-rl-steps``."""
    from rollvault.recipes.async_grpo import final_model_path, prepare, train

    tmp = Path(args.run_dir)
    base = tmp / "base_model"
    if args.hidden_size:
        build_larger_model(base, args.hidden_size, args.num_layers)
    config = recipe_config(
        tmp, base, args.prepare_rl_steps, ["model.build_default=true", *args.set]
    )
    with prepare(config) as setup:
        asyncio.run(train(setup))
    print(final_model_path(config))
    return 0


def build_larger_model(path: Path, hidden_size: int, num_layers: int) -> None:
    """The default architecture (Qwen2-style, character tokenizer) at another size."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollvault.training.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


# -- the parent: rounds, CPU accounting, summary ------------------------------------------------


KNOWN_KINDS = frozenset(
    {
        "resource tracker",
        "trainer process",
        "main (controller [+ trainer])",
        "main",
        "generation worker",
    }
)


def process_kind(proc: Any) -> str:
    try:
        name = proc.name()
        cmdline = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - the process exited between listing and reading
        return "gone"
    if "resource_tracker" in cmdline:
        return "resource tracker"
    if name == "rollvault-train":  # trainer.placement=process (it names itself)
        return "trainer process"
    if "--side" in cmdline:
        return "main (controller [+ trainer])" if "rollvault" in cmdline else "main"
    if "multiprocessing" in cmdline or "spawn_main" in cmdline:
        return "generation worker"
    return str(name)


def cpu_of(proc: Any) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def run_child(
    side: str,
    tmp: Path,
    start: Path,
    steps: int,
    overrides: Sequence[str],
    round_index: int,
    trl_threads: int = 0,
) -> RunResult:
    import psutil

    run_dir = tmp / f"r{round_index}_{side}"
    out = run_dir / "result.json"
    run_dir.mkdir(parents=True)
    command = [sys.executable, __file__, "--side", side, "--start", str(start)]
    command += ["--steps", str(steps), "--run-dir", str(run_dir), "--out", str(out)]
    command += ["--trl-threads", str(trl_threads)]
    for override in overrides:
        command += ["--set", override]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time()
    proc = psutil.Popen(command, stdout=subprocess.DEVNULL)
    last: dict[int, tuple[str, float]] = {}
    history: dict[int, list[tuple[float, float]]] = {}
    """Per pid: (time.time(), its CPU seconds) at every sample."""
    while proc.poll() is None:
        try:
            for p in [proc, *proc.children(recursive=True)]:
                kind = last.get(p.pid, ("", 0.0))[0] or process_kind(p)
                # A spawned child names itself once it runs (the trainer process): until then
                # it looks like the generation worker, so look again (but an exiting child's
                # empty command line must not undo what it was). A child sampled between its
                # fork and its exec still has this script's command line: look again too.
                if kind == "generation worker" and process_kind(p) == "trainer process":
                    kind = "trainer process"
                elif kind not in KNOWN_KINDS and (fresh := process_kind(p)) in KNOWN_KINDS:
                    kind = fresh
                last[p.pid] = (kind, cpu_of(p))
                history.setdefault(p.pid, []).append((time.time(), last[p.pid][1]))
        except psutil.Error:
            pass  # a process exited while sampled: its last sample stands
        time.sleep(CPU_SAMPLE_S)
    wall = time.time() - wall
    if proc.returncode != 0:
        raise SystemExit(f"{side} run {round_index} failed with exit code {proc.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    by_kind: dict[str, float] = {}
    for kind, seconds in last.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    data = json.loads(out.read_text())
    times = data["step_times"]
    steady = times[-1] - times[0]
    # Tokens of the steps after the first (the steady window starts at the first step's end).
    tokens = sum(data["tokens"][1:])
    steady_ms = steady_cpu_per_step(history, last, times)
    loop_cpu = data.get("loop_cpu") or []
    loop_ms = (
        1000.0 * (loop_cpu[-1] - loop_cpu[0]) / (len(loop_cpu) - 1)
        if len(loop_cpu) > 1
        else float("nan")
    )
    return RunResult(
        side=side,
        steps=data["steps"],
        steady_s=steady,
        total_s=wall,
        steps_per_s=(len(times) - 1) / steady,
        total_steps_per_s=len(times) / wall,
        tokens_per_s=tokens / steady,
        cpu_s=cpu,
        cores_used=cpu / wall,
        cpu_by_process=by_kind,
        steady_cpu_ms_per_step=steady_ms,
        rewards=data["rewards"],
        loop_cpu_per_step_ms=loop_ms,
    )


def steady_cpu_per_step(
    history: dict[int, list[tuple[float, float]]],
    last: dict[int, tuple[str, float]],
    step_times: Sequence[float],
) -> dict[str, float]:
    """Per kind of process, ms of CPU per step between the first and the last step's end.

    Each process's CPU is interpolated linearly between its samples (every
    ``CPU_SAMPLE_S``) at both instants; a process not yet sampled counts 0, one
    gone keeps its last sample.
    """
    if len(step_times) < 2:
        return {}
    first, final = step_times[0], step_times[-1]
    out: dict[str, float] = {}
    for pid, samples in history.items():
        at = np.array([t for t, _ in samples])
        cpu = np.array([c for _, c in samples])
        spent = float(np.interp(final, at, cpu, left=0.0) - np.interp(first, at, cpu, left=0.0))
        kind = last[pid][0]
        out[kind] = out.get(kind, 0.0) + spent
    return {k: 1000.0 * v / (len(step_times) - 1) for k, v in out.items()}


def describe(r: RunResult) -> str:
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(r.cpu_by_process.items()))
    return (
        f"{r.side:9s}: {r.steps} steps, {r.steps_per_s:5.2f} steps/s steady "
        f"({r.total_steps_per_s:5.2f} with start-up, {r.total_s:5.1f}s), "
        f"{r.tokens_per_s:6.0f} tokens/s, CPU {r.cpu_s:5.1f}s = {r.cores_used:.2f} cores "
        f"[{parts}], reward {np.nanmean(r.rewards):.3f}"
        + (
            ""
            if np.isnan(r.loop_cpu_per_step_ms)
            else f", event loop {r.loop_cpu_per_step_ms:.0f} ms CPU/step"
        )
        + f", load {os.getloadavg()[0]:.1f}"
        + (
            "; steady CPU ms/step: "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.steady_cpu_ms_per_step.items()))
            + f" (total {sum(r.steady_cpu_ms_per_step.values()):.0f})"
            if r.steady_cpu_ms_per_step
            else ""
        )
    )


def summarise(results: list[RunResult], windows: int = 4) -> list[str]:
    lines = []
    by_side = {s: [r for r in results if r.side == s] for s in SIDES}
    steady = [a.steps_per_s / b.steps_per_s for a, b in zip(*by_side.values(), strict=True)]
    total = [
        a.total_steps_per_s / b.total_steps_per_s for a, b in zip(*by_side.values(), strict=True)
    ]
    tokens = [a.tokens_per_s / b.tokens_per_s for a, b in zip(*by_side.values(), strict=True)]
    for name, ratios in (("steps/s steady", steady), ("steps/s with start-up", total)):
        lines.append(
            f"rollvault / TRL, {name}: per round "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + f"; median {statistics.median(ratios):.2f} (goal >= 1.5)"
        )
    lines.append(f"rollvault / TRL, rollout tokens/s: median {statistics.median(tokens):.2f}")
    for side, mine in by_side.items():
        lines.append(
            f"median {side:9s}: {statistics.median(r.steps_per_s for r in mine):.2f} steps/s, "
            f"{statistics.median(r.tokens_per_s for r in mine):.0f} tokens/s, "
            f"{statistics.median(r.cores_used for r in mine):.2f} cores"
        )
    steps = min(len(r.rewards) for r in results)
    size = max(steps // windows, 1)
    for side, mine in by_side.items():
        curve = np.nanmean([r.rewards[:steps] for r in mine], axis=0)
        cells = [f"{np.mean(curve[i : i + size]):.3f}" for i in range(0, steps, size)]
        lines.append(f"reward per {size} steps, {side:9s} (mean of rounds): " + " ".join(cells))
    return lines


def parent_main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as name:
        tmp = Path(name)
        start = Path(args.start) if args.start else build_start(args, tmp)
        results: list[RunResult] = []
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            for side in [s for s in order if s in args.sides]:
                overrides = args.set if side == "rollvault" else []
                result = run_child(
                    side, tmp, start, args.steps, overrides, round_index, args.trl_threads
                )
                results.append(result)
                print(f"round {round_index} {describe(result)}", flush=True)
        if len(args.sides) == len(SIDES):
            for line in summarise(results):
                print(line)
        if args.json:
            print(json.dumps({"runs": [asdict(r) for r in results]}))
    return 0


def build_start(args: argparse.Namespace, tmp: Path) -> Path:
    run_dir = tmp / "start"
    command = [sys.executable, __file__, "--prepare", "--run-dir", str(run_dir)]
    command += ["--prepare-rl-steps", str(args.prepare_rl_steps)]
    if args.hidden_size:
        command += ["--hidden-size", str(args.hidden_size), "--num-layers", str(args.num_layers)]
    for override in args.prepare_set:
        command += ["--set", override]
    began = time.time()
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    start = Path(output.strip().splitlines()[-1])
    print(f"start weights: {start} ({time.time() - began:.0f}s to build)", flush=True)
    return start


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (ABBA order)")
    parser.add_argument("--prepare-rl-steps", type=int, default=100)
    parser.add_argument("--hidden-size", type=int, default=0, help="0: the recipe's model")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--start", help="a model directory to start from (skips building one)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="DOTPATH=VALUE",
        help="override rollvault's recipe in the timed runs (repeatable)",
    )
    parser.add_argument(
        "--prepare-set",
        action="append",
        default=[],
        metavar="DOTPATH=VALUE",
        help="override the recipe while building the start weights (e.g. trainer.warmup.steps)",
    )
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=0,
        help="torch threads of the TRL process (0: torch's default, one per core); 1 avoids "
        "OpenMP's spinning threads on a machine other work oversubscribes",
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        default=list(SIDES),
        help="run only these sides (no ratio without both): e.g. rollvault alone, to compare "
        "its per-process CPU between two trees",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--cprofile",
        metavar="PATH",
        help="with --side rollvault: cProfile the event loop (the controller) into PATH",
    )
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.side:
        return child_main(args)
    if args.prepare:
        return prepare_start(args)
    return parent_main(args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
