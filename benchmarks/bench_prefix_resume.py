"""Benchmark of token-prefix resume (issue 16): tokens kept per kill, ``off`` vs ``keep``.

Runs the chaos harness on real ``rollvault run`` children (the local model
gate on the reverse recipe, an untrained tiny model so responses run to
``max_new_tokens``) with the same seeded kill schedule for each
``rollout.prefix_resume`` mode, and prints per mode: the starts, the
harness's problems (must be none), the tokens of journaled prefixes that the
restarts continued after (``restores.jsonl``), the sealed tokens lost
(``attempts.jsonl``) and the run's wall time.

    .venv/bin/python benchmarks/bench_prefix_resume.py --kills 4 --window 6 --json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import rollvault
from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos

RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_reverse.yaml"


def _overrides(mode: str, args: argparse.Namespace) -> tuple[str, ...]:
    return (
        f"dataset.num_prompts={args.prompts}",
        "grpo.max_num_epochs=1",
        "trainer.warmup.steps=0",
        f"gate.local_model.max_new_tokens={args.max_new_tokens}",
        f"reward.max_response_tokens={args.max_new_tokens + 1}",
        f"rollout.prefix_resume={mode}",
        f"rollout.prefix_resume_tokens={args.chunk}",
        "model.path=model",
        "logging.tensorboard=false",
        "checkpointing.save_period=1000",
    )


def _one(mode: str, args: argparse.Namespace, root: Path) -> dict[str, object]:
    plan = ChaosPlan(
        run_dir=root / mode,
        kills=args.kills,
        seed=args.seed,
        config_path=RECIPE,
        overrides=_overrides(mode, args),
        kill_window_s=args.window,
        start_timeout_s=600.0,
    )
    started = time.perf_counter()
    report = run_chaos(plan)
    seconds = time.perf_counter() - started
    check = report.check
    restores = check.history.restores if check is not None else []
    return {
        "mode": mode,
        "starts": [s.outcome.value for s in report.starts],
        "problems": report.problems,
        "prefix_tokens_kept": sum(r.prefix_tokens_resumed for r in restores),
        "siblings_resumed_mid_turn": sum(len(r.prefixes_resumed) for r in restores),
        "sealed_tokens_lost": check.accounting.lost_tokens if check is not None else None,
        "generated_tokens": check.accounting.generated_tokens if check is not None else None,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="off,keep")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--window", type=float, default=6.0, help="kill window after a start, s")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rv-prefix-") as tmp:
        results = [_one(mode, args, Path(tmp)) for mode in args.modes.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for result in results:
        print(result)


if __name__ == "__main__":
    main()
