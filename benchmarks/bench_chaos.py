"""Benchmark of the work a SIGKILL costs: ``restore_mode=latest`` vs the baseline (issue 5).

For each scenario and seed it runs the chaos harness (``rollvault chaos``)
twice on real ``rollvault run`` child processes with the same seeded kill
schedule: once resuming from the newest rollout snapshot (``latest``) and
once from the last trainer checkpoint only (``trainer_checkpoint``, what
frameworks without rollout snapshots do). Each run is killed ``--kills``
times, finishes, and must pass every harness check.

Work lost is tokens generated minus tokens that reached training. *logged*
counts sealed attempts (``attempts.jsonl``); attempts still generating at a
kill never reach the log, so *+ in-flight* adds them, measured at each kill
(dispatched and never returned, read from the dispatch journal and the newest
snapshot before the next start, each at the length of the attempt that redid
it: an upper bound of what it had generated). The ratio baseline / latest is
printed for both.

Scenarios:

- ``ci``: the harness defaults that CI runs (a step ~0.2 s, snapshots every
  0.2 s, a trainer checkpoint every 4 steps, kills up to 1 s after a start).
  Snapshots are about as far apart as steps, and kills come before most
  trainer checkpoints, so the baseline has little to lose.
- ``p20s2``: ``p20`` with snapshots 2 s apart instead of back to back, the
  cadence the seal journal is for (issue 16).
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

Since issue 16 each scenario also runs ``latest`` without the seal journal
(``latest_no_journal``, the behaviour before it); the baseline runs without
the journal too (it never replays one).

- ``c60``: the issue's realistic cadence for the 20x goal: trainer checkpoints
  500 steps (at least 60 s) apart, snapshots on the packaged default schedule
  (``interval_s: null``: 60 s apart while the seal journal keeps every seal,
  5 s without it), kills up to 100 s after a start; each run reports the
  measured spacing.

Each run also reports the loss measured at each kill (what the kill left on
disk, read before the next start: the seals durable in the journal or the
newest snapshot, and the attempts in flight), see
:mod:`rollvault.checkpoint_tools.chaos.loss`.

Usage: python benchmarks/bench_chaos.py [--scenarios ci,p20,p50] [--seeds 0] [--kills 10]
       [--variants latest,latest_no_journal,trainer_checkpoint] [--workdir DIR] [--keep] [--json]
The runs go to .bench_tmp/chaos/ in the checkout and are removed at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.report import ChaosReport, inflight_measured, lost_work_ratio
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.config.schema import RestoreMode

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "chaos"


@dataclass(frozen=True)
class Scenario:
    overrides: tuple[str, ...]
    kill_window_s: float
    start_timeout_s: float = 120.0
    """A start that runs longer is a failure (the last start runs what is left)."""


def _long(
    save_period: int,
    num_prompts: int,
    kill_window_s: float,
    interval_s: float | None = 0.05,
    start_timeout_s: float = 120.0,
) -> Scenario:
    """None: the default schedule (the harness's own 0.2 s overridden with null)."""
    interval = "null" if interval_s is None else f"{interval_s:g}"
    return Scenario(
        overrides=(
            f"dataset.num_prompts={num_prompts}",
            "gate.simulated.latency_per_token_s=0.005",
            f"rollout_checkpointing.interval_s={interval}",
            f"checkpointing.save_period={save_period}",
        ),
        kill_window_s=kill_window_s,
        start_timeout_s=start_timeout_s,
    )


SCENARIOS = {
    "ci": Scenario(overrides=(), kill_window_s=1.0),
    "p20": _long(save_period=20, num_prompts=640, kill_window_s=8.0),
    "p50": _long(save_period=50, num_prompts=1200, kill_window_s=12.0),
    # Snapshots 2 s apart (the seal journal's case: snapshots need not be back to back).
    "p20s2": _long(save_period=20, num_prompts=640, kill_window_s=8.0, interval_s=2.0),
    # The realistic cadence: trainer checkpoints >= 60 s apart (500 steps of
    # ~0.13-0.2 s), snapshots as the recipes take them (the default schedule), kills up
    # to 100 s after a start.
    "c60": _long(
        save_period=500,
        num_prompts=4000,
        kill_window_s=100.0,
        interval_s=None,
        start_timeout_s=900.0,
    ),
}
JOURNAL_OFF = ("rollout_checkpointing.journal.enabled=false",)


@dataclass(frozen=True)
class Variant:
    """One arm of a scenario: a restore mode, with or without the seal journal."""

    label: str
    mode: RestoreMode
    overrides: tuple[str, ...] = ()


VARIANTS = (
    Variant("latest", RestoreMode.LATEST),
    Variant("latest_no_journal", RestoreMode.LATEST, JOURNAL_OFF),
    Variant("trainer_checkpoint", RestoreMode.TRAINER_CHECKPOINT, JOURNAL_OFF),
)
"""``latest`` with the seal journal (the default since issue 16), without it (as
before issue 16), and the baseline (which never replays a journal)."""


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
        "inflight_measured_tokens": inflight_measured(report),
        "restores_from_trainer_checkpoint": sum(r.base_train_step > 0 for r in restores),
        "trainer_checkpoint_spacing_s": checkpoint_spacing_s(report),
        "seconds": report.seconds,
        "problems": report.problems,
        **measured_loss(report),
    }


def checkpoint_spacing_s(report: ChaosReport) -> float:
    """Seconds between trainer checkpoints: ``save_period`` x the median step time.

    The step time of each start is its ``metrics.jsonl`` span over its steps (its
    restore excluded); the median over the starts that logged two steps or more.
    """
    path = Path(report.config.logging.log_dir) / "metrics.jsonl"
    times: dict[int, list[float]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        times.setdefault(int(record["incarnation"]), []).append(float(record["time"]))
    per_step = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    if not per_step:
        return 0.0
    return report.config.checkpointing.save_period * statistics.median(per_step)


def measured_loss(report: ChaosReport) -> dict[str, Any]:
    """The loss measured at each kill (:mod:`rollvault.checkpoint_tools.chaos.loss`)."""
    loss = report.loss
    if loss is None:
        return {}
    counters = (
        "in_flight_attempts",
        "in_flight_tokens",
        "in_flight_unmatched",
        "not_durable_seals",
        "not_durable_tokens",
        "dropped_seals",
        "dropped_tokens",
        "durable_lost_tokens",
    )
    return {
        "measured": {name: loss.total(name) for name in counters}
        | {
            "after_last_kill_tokens": loss.after_last_kill_tokens,
            "total_lost_tokens": loss.total_lost_tokens,
            "physical_limit_tokens": loss.physical_limit_tokens,
            "limit_ratio": loss.limit_ratio(),
            "limit_ratio_half_done": loss.limit_ratio(0.5),
            "durable_lost": [rid for kill in loss.kills for rid in kill.durable_lost],
            "per_kill": [
                {
                    "start": kill.start,
                    "in_flight_tokens": kill.in_flight_tokens,
                    "not_durable_tokens": kill.not_durable_tokens,
                    "dropped_tokens": kill.dropped_tokens,
                    "durable_lost_tokens": kill.durable_lost_tokens,
                }
                for kill in loss.kills
            ],
        }
    }


def run_seed(root: Path, name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    result: dict[str, Any] = {"seed": seed}
    for variant in _variants(args):
        plan = ChaosPlan(
            run_dir=root / name / f"seed_{seed}" / variant.label,
            kills=args.kills,
            seed=seed,
            restore_mode=variant.mode,
            overrides=(*scenario.overrides, *variant.overrides),
            kill_window_s=scenario.kill_window_s,
            start_timeout_s=scenario.start_timeout_s,
        )
        result[variant.label] = figures(run_chaos(plan))
    return result


def _variants(args: argparse.Namespace) -> list[Variant]:
    wanted = args.variants.split(",")
    unknown = sorted(set(wanted) - {v.label for v in VARIANTS})
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {[v.label for v in VARIANTS]}")
    return [v for v in VARIANTS if v.label in wanted]


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Lost tokens per variant over all seeds, and each variant's ratio to the baseline."""
    labels = [label for label in rows[0] if label != "seed"]
    out: dict[str, float] = {}
    for label in labels:
        logged = sum(int(row[label].get("lost_tokens", 0)) for row in rows)
        inflight = sum(int(row[label].get("inflight_measured_tokens", 0)) for row in rows)
        out[f"{label}_lost"] = logged
        out[f"{label}_lost_with_inflight"] = logged + inflight
    baseline = "trainer_checkpoint"
    if f"{baseline}_lost" in out:
        for label in labels:
            if label != baseline:
                out[f"{label}_ratio_logged"] = lost_work_ratio(
                    int(out[f"{label}_lost"]), int(out[f"{baseline}_lost"])
                )
                out[f"{label}_ratio_with_inflight"] = lost_work_ratio(
                    int(out[f"{label}_lost_with_inflight"]),
                    int(out[f"{baseline}_lost_with_inflight"]),
                )
    return out


def table(name: str, rows: list[dict[str, Any]], summary: dict[str, float]) -> str:
    scenario = SCENARIOS[name]
    labels = [label for label in rows[0] if label != "seed"]
    lines = [
        f"scenario {name} (overrides: {' '.join(scenario.overrides) or 'harness defaults'}; "
        f"kills up to {scenario.kill_window_s:g}s after each start)",
        "  seed variant             kills  generated  trained   lost  +in-flight  "
        "restores@ckpt  seconds  problems",
    ]
    for row in rows:
        for label in labels:
            f = row[label]
            if "kills" not in f:
                lines.append(f"  {row['seed']:4d} {label:19s} did not finish: {f['problems']}")
                continue
            lines.append(
                f"  {row['seed']:4d} {label:19s} {f['kills']:5d} {f['generated_tokens']:10d} "
                f"{f['trained_tokens']:8d} {f['lost_tokens']:6d} {f['inflight_measured_tokens']:11d} "
                f"{f['restores_from_trainer_checkpoint']:14d} {f['seconds']:8.1f}  "
                f"{len(f['problems'])}"
            )
    for label in labels:
        line = (
            f"  {label}: {summary[f'{label}_lost']:.0f} tokens regenerated (logged), "
            f"{summary[f'{label}_lost_with_inflight']:.0f} with the in-flight attempts (measured)"
        )
        if f"{label}_ratio_logged" in summary:
            line += (
                f"; trainer_checkpoint / {label}: {summary[f'{label}_ratio_logged']:.1f}x logged, "
                f"{summary[f'{label}_ratio_with_inflight']:.1f}x with in-flight"
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="ci,p20,p50")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument(
        "--variants",
        default=",".join(v.label for v in VARIANTS),
        help="comma-separated: latest (with the seal journal), latest_no_journal, "
        "trainer_checkpoint",
    )
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
