"""Soak benchmark: hundreds of SIGKILLs of the simulated default, across seeds (issue 11).

Runs the chaos harness (``rollvault chaos``, :mod:`rollvault.checkpoint_tools.chaos`)
on real ``rollvault run`` child processes, one seed per harness run, until at
least ``--kills`` SIGKILLs have been delivered. Each harness run kills its
child ``--kills-per-run`` times at seeded moments, lets the last start finish,
and checks every invariant it knows (every prompt of every epoch trained
exactly once or dropped, no group trained twice, retrained steps keep their
prompts, restored groups train as themselves, sealed siblings reused, no
orphan rows in the final snapshot). A violation is any problem it reports;
the goal is 0.

It reports kills delivered, harness runs, starts, violations (with the first
few named) and wall time, and exits 1 when any violation was found.

Usage: python benchmarks/bench_soak.py [--kills 500] [--kills-per-run 20] [--first-seed 0]
       [--kill-window 1.0] [--num-prompts 96] [--max-minutes M] [--workdir DIR] [--keep] [--json]
``--num-prompts`` sets the harness run's dataset (two epochs of it): it must
be long enough that every kill lands before the run ends, which the harness
reports as a problem otherwise (a simulated start takes ~0.3 s to begin
generating, so 48 prompts end too soon for 25 kills).
The runs go to .bench_tmp/soak/ in the checkout and are removed as they pass,
unless ``--keep``; a run with a violation is always kept for inspection.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "soak"


@dataclass
class SoakResult:
    kills: int = 0
    harness_runs: int = 0
    starts: int = 0
    violations: int = 0
    failed_runs: list[str] = field(default_factory=list)
    first_problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    stopped_early: bool = False
    """``--max-minutes`` ran out before ``--kills`` kills."""


def soak(args: argparse.Namespace) -> SoakResult:
    result = SoakResult()
    started = time.perf_counter()
    seed = args.first_seed
    deadline = started + 60 * args.max_minutes if args.max_minutes else None
    while result.kills < args.kills:
        if deadline is not None and time.perf_counter() > deadline:
            result.stopped_early = True
            break
        run_dir = args.workdir / f"seed_{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        plan = ChaosPlan(
            run_dir=run_dir,
            kills=min(args.kills_per_run, args.kills - result.kills),
            seed=seed,
            kill_window_s=args.kill_window,
            overrides=(f"dataset.num_prompts={args.num_prompts}",),
        )
        report = run_chaos(plan)
        result.harness_runs += 1
        result.kills += report.kills_delivered
        result.starts += len(report.starts)
        if report.problems:
            result.violations += len(report.problems)
            result.failed_runs.append(str(run_dir))
            result.first_problems += [f"seed {seed}: {p}" for p in report.problems[:3]]
        elif not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        print(
            f"seed {seed}: {report.kills_delivered} kills, {len(report.starts)} starts, "
            f"{len(report.problems)} problems, {report.seconds:.1f}s "
            f"(total {result.kills} kills)",
            file=sys.stderr,
            flush=True,
        )
        seed += 1
    result.wall_s = time.perf_counter() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--kills-per-run", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--kill-window", type=float, default=1.0)
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--max-minutes", type=float, default=0.0, help="stop after this long (0: no limit)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.kills < 1 or args.kills_per_run < 1:
        parser.error("--kills and --kills-per-run must be >= 1")
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = soak(args)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(
            f"soak: {result.kills} kills over {result.harness_runs} harness runs "
            f"({result.starts} starts), {result.violations} violations, "
            f"{result.wall_s / 60:.1f} min wall"
            + (" (stopped early by --max-minutes)" if result.stopped_early else "")
        )
        for problem in result.first_problems[:10]:
            print(f"  - {problem}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
