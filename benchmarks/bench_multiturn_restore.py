"""Benchmark of the work a SIGKILL costs a multi-turn run: turn-level restore vs restart (issue 13).

For each seed it runs the chaos harness (``rollvault chaos``) twice on real
``rollvault run`` child processes with the same seeded kill schedule, on the
guessing game (``dataset.kind=guess``: episodes of up to four turns) on the
simulated gate, each turn slow enough that kills land mid-episode: once with
``rollout.turn_level_restore=true`` (an interrupted episode continues at its
last committed turn) and once with ``false`` (it restarts from its first
turn, as verl's agent loop and SkyRL do). Both runs must pass every harness
check, the turn-level ones included.

Work is counted in model tokens from ``turns.jsonl``, which logs every
committed turn of every start (rolled-back starts too): *generated* is all of
them, *trained* those of the turns the trained episodes consist of, and
*lost* the difference, split into *rolled back* (turns committed after the
snapshot a restore used: lost in both modes, by the same mechanism, their
amount set by where the kills land) and *committed* (turns a snapshot held:
what turn-level restore keeps, lost anyway when their group is given up after
too many interruptions; the restart baseline regenerates them). Tokens of a
turn still being generated at a kill are never committed, so they are not
counted in either mode (the same for both).

Usage: python benchmarks/bench_multiturn_restore.py [--seeds 0,1] [--kills 10]
       [--workdir DIR] [--keep] [--json]
The runs go to .bench_tmp/multiturn/ in the checkout and are removed at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.report import ChaosReport
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.checkpoint_tools.run_history import RunHistory
from rollvault.ledger.statuses import RolloutAttemptStatus

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "multiturn"
OVERRIDES = (
    "dataset.kind=guess",
    "dataset.num_prompts=32",
    "gate.simulated.min_response_tokens=8",
    "gate.simulated.median_response_tokens=16",
    "gate.simulated.max_response_tokens=32",
    "gate.simulated.latency_per_token_s=0.02",
    "reward.max_response_tokens=256",
)


def figures(report: ChaosReport) -> dict[str, Any]:
    """Tokens generated, trained and lost, per kill, from the run's logs."""
    if report.problems:
        raise SystemExit("a run failed its checks:\n" + "\n".join(report.problems))
    assert report.check is not None
    return history_figures(report.check.history, report.kills_delivered)


def history_figures(history: RunHistory, kills: int) -> dict[str, Any]:
    """The figures of one run's effective history (see the module docstring)."""
    tokens = {turn.staging_key: turn.num_tokens for turn in history.turns}
    generated = sum(tokens.values())
    # Every sealed line, rolled back or not: a seal the dispatch journal restored
    # trains although its attempts.jsonl line came after the snapshot.
    sealed = {
        a.gate_rollout_id: a.staging_keys or []
        for a in history.attempts
        if a.status is RolloutAttemptStatus.SEALED
    }
    trained_keys = {
        key
        for records in history.steps.values()
        for record in records
        for gate_rollout_id in record.gate_rollout_ids
        for key in sealed.get(gate_rollout_id, [])
    }
    trained = sum(tokens.get(key, 0) for key in trained_keys)
    # Lost work, split by where it was: turns committed after the snapshot a restore
    # used (rolled back: the same in both modes, up to timing), and turns that a
    # snapshot held (what turn-level restore keeps; lost anyway when their group
    # is given up after too many interruptions).
    lost_rolled_back = lost_committed = 0
    for turn in history.turns:
        if turn.staging_key in trained_keys:
            continue
        if history.is_void(turn.incarnation, turn.seq):
            lost_rolled_back += turn.num_tokens
        else:
            lost_committed += turn.num_tokens
    return {
        "kills": kills,
        "generated_tokens": generated,
        "trained_tokens": trained,
        "lost_tokens": generated - trained,
        "lost_tokens_per_kill": (generated - trained) / kills if kills else 0.0,
        "lost_rolled_back_tokens": lost_rolled_back,
        "lost_committed_tokens": lost_committed,
        "lost_committed_per_kill": lost_committed / kills if kills else 0.0,
        "turns_resumed": sum(r.turns_resumed for r in history.restores),
        "episodes_resumed": sum(len(r.episodes_resumed) for r in history.restores),
        "episodes_restarted": sum(len(r.episodes_restarted) for r in history.restores),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    results: dict[str, dict[str, Any]] = {}
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            for turn_level in (True, False):
                name = f"seed{seed}_{'turns' if turn_level else 'restart'}"
                plan = ChaosPlan(
                    run_dir=args.workdir / name,
                    kills=args.kills,
                    seed=seed,
                    overrides=(
                        *OVERRIDES,
                        f"rollout.turn_level_restore={str(turn_level).lower()}",
                    ),
                    kill_window_s=3.0,
                )
                results[name] = figures(run_chaos(plan))
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'run':<18} {'kills':>5} {'generated':>10} {'trained':>8} {'lost':>7} "
        f"{'lost/kill':>9} {'rolled back':>11} {'committed':>9} {'resumed':>8} {'restarted':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:<18} {r['kills']:>5} {r['generated_tokens']:>10} {r['trained_tokens']:>8} "
            f"{r['lost_tokens']:>7} {r['lost_tokens_per_kill']:>9.1f} "
            f"{r['lost_rolled_back_tokens']:>11} {r['lost_committed_tokens']:>9} "
            f"{r['episodes_resumed']:>8} {r['episodes_restarted']:>9}"
        )


if __name__ == "__main__":
    main()
