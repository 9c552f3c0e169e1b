"""Benchmark of the work a SIGKILL costs: ``restore_mode=latest`` vs the baseline (issue 5).

For each scenario and seed it runs the chaos harness (``rollvault chaos``)
twice on real ``rollvault run`` child processes with the same seeded kill
schedule: once resuming from the newest rollout snapshot (``latest``) and
once from the last trainer checkpoint only (``trainer_checkpoint``, what
frameworks without rollout snapshots do). Each run is killed ``--kills``
times, finishes, and must pass every harness check.

Work lost is tokens generated minus tokens that reached training. *logged*
counts sealed attempts (``attempts.jsonl``); attempts still generating at a
kill never reach the log, so *+ in-flight* adds an estimate of them (every
attempt slot busy and half done at each kill), the same for both modes. The
ratio baseline / latest is printed for both; the truth lies between them.

Scenarios:

- ``ci``: the harness defaults that CI runs (a step ~0.2 s, snapshots every
  0.2 s, a trainer checkpoint every 4 steps, kills up to 1 s after a start).
  Snapshots are about as far apart as steps, and kills come before most
  trainer checkpoints, so the baseline has little to lose.
- ``p20`` and ``p50``: closer to a production cadence, where trainer
  checkpoints are many steps apart: shorter attempts (a step ~0.15 s),
  snapshots every 0.05 s (in practice back to back, ~0.1-0.2 s each here,
  since a commit fsyncs every file and directory), a trainer checkpoint every
  20 steps (kills up to 8 s after a start, 640 prompts x 2 epochs) or every
  50 steps, the packaged default (kills up to 12 s, 1,200 prompts x 2 epochs);
  the datasets are sized so that every kill lands before the run ends.

The regenerated-work ratio is roughly (time since the last trainer checkpoint
+ in-flight) / (time since the last committed snapshot + commit latency +
in-flight) at a kill, so it grows with ``save_period`` and with the time
between kills.

Usage: python benchmarks/bench_chaos.py [--scenarios ci,p20,p50] [--seeds 0] [--kills 10]
       [--workdir DIR] [--keep] [--json]
The runs go to .bench_tmp/chaos/ in the checkout and are removed at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.report import ChaosReport, inflight_estimate, lost_work_ratio
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.config.schema import RestoreMode

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "chaos"


@dataclass(frozen=True)
class Scenario:
    overrides: tuple[str, ...]
    kill_window_s: float


def _long(save_period: int, num_prompts: int, kill_window_s: float) -> Scenario:
    return Scenario(
        overrides=(
            f"dataset.num_prompts={num_prompts}",
            "gate.simulated.latency_per_token_s=0.005",
            "rollout_checkpointing.interval_s=0.05",
            f"checkpointing.save_period={save_period}",
        ),
        kill_window_s=kill_window_s,
    )


SCENARIOS = {
    "ci": Scenario(overrides=(), kill_window_s=1.0),
    "p20": _long(save_period=20, num_prompts=640, kill_window_s=8.0),
    "p50": _long(save_period=50, num_prompts=1200, kill_window_s=12.0),
}
MODES = (RestoreMode.LATEST, RestoreMode.TRAINER_CHECKPOINT)


def figures(report: ChaosReport) -> dict[str, Any]:
    if report.check is None:
        return {"problems": report.problems}
    accounting = report.check.accounting
    restores = report.check.history.restores
    return {
        "kills": report.kills_delivered,
        "generated_tokens": accounting.generated_tokens,
        "trained_tokens": accounting.trained_tokens,
        "lost_tokens": accounting.lost_tokens,
        "inflight_estimate_tokens": inflight_estimate(report),
        "restores_from_trainer_checkpoint": sum(r.base_train_step > 0 for r in restores),
        "seconds": report.seconds,
        "problems": report.problems,
    }


def run_seed(root: Path, name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    result: dict[str, Any] = {"seed": seed}
    for mode in MODES:
        plan = ChaosPlan(
            run_dir=root / name / f"seed_{seed}" / mode.value,
            kills=args.kills,
            seed=seed,
            restore_mode=mode,
            overrides=scenario.overrides,
            kill_window_s=scenario.kill_window_s,
        )
        result[mode.value] = figures(run_chaos(plan))
    return result


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    def total(mode: RestoreMode, key: str) -> int:
        return sum(int(row[mode.value].get(key, 0)) for row in rows)

    logged = [total(mode, "lost_tokens") for mode in MODES]
    inflight = [total(mode, "inflight_estimate_tokens") for mode in MODES]
    with_inflight = [logged[i] + inflight[i] for i in range(len(MODES))]
    return {
        "latest_lost": logged[0],
        "baseline_lost": logged[1],
        "ratio_logged": lost_work_ratio(logged[0], logged[1]),
        "latest_lost_with_inflight": with_inflight[0],
        "baseline_lost_with_inflight": with_inflight[1],
        "ratio_with_inflight": lost_work_ratio(with_inflight[0], with_inflight[1]),
    }


def table(name: str, rows: list[dict[str, Any]], summary: dict[str, float]) -> str:
    scenario = SCENARIOS[name]
    lines = [
        f"scenario {name} (overrides: {' '.join(scenario.overrides) or 'harness defaults'}; "
        f"kills up to {scenario.kill_window_s:g}s after each start)",
        "  seed mode                kills  generated  trained   lost  +in-flight  "
        "restores@ckpt  seconds  problems",
    ]
    for row in rows:
        for mode in MODES:
            f = row[mode.value]
            if "kills" not in f:
                lines.append(f"  {row['seed']:4d} {mode.value:19s} did not finish: {f['problems']}")
                continue
            lines.append(
                f"  {row['seed']:4d} {mode.value:19s} {f['kills']:5d} {f['generated_tokens']:10d} "
                f"{f['trained_tokens']:8d} {f['lost_tokens']:6d} {f['inflight_estimate_tokens']:11d} "
                f"{f['restores_from_trainer_checkpoint']:14d} {f['seconds']:8.1f}  "
                f"{len(f['problems'])}"
            )
    lines.append(
        f"  tokens regenerated, all seeds: latest {summary['latest_lost']:.0f}, trainer_checkpoint "
        f"{summary['baseline_lost']:.0f}: ratio {summary['ratio_logged']:.1f}x logged; with the "
        f"in-flight estimate {summary['latest_lost_with_inflight']:.0f} vs "
        f"{summary['baseline_lost_with_inflight']:.0f}: ratio {summary['ratio_with_inflight']:.1f}x"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="ci,p20,p50")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = args.scenarios.split(",")
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; known: {sorted(SCENARIOS)}")
    if args.workdir.exists():
        raise SystemExit(f"{args.workdir} exists; remove it or pass another --workdir")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    results: dict[str, Any] = {}
    try:
        for name in names:
            rows = [run_seed(args.workdir, name, seed, args) for seed in seeds]
            results[name] = {"runs": rows, "totals": totals(rows)}
            if not args.json:
                print(table(name, rows, results[name]["totals"]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
