"""Benchmark of token-prefix resume (issue 16): tokens kept per kill, ``off`` vs ``keep``.

Runs real ``rollvault run`` children (the local model gate on the reverse
recipe, an untrained tiny model so responses run long) for each
``rollout.prefix_resume`` mode with the same seeded kill schedule, then the
chaos harness's checks on the finished run, and prints per mode: the starts,
the problems (must be none), the tokens of journaled prefixes that the
restarts continued after (``restores.jsonl``), the tokens of unsealed
attempts' newest partials on disk at each kill (what ``keep`` could keep at
most), the sealed tokens lost (``attempts.jsonl``) and the wall time.

``--kill-after-seal`` (the default) kills each start a seeded delay after the
first seal record *that start* journaled, so every kill lands while
generation runs (on a loaded machine a start may take tens of seconds to
generate its first token, and the harness's delay after the start then kills
before any); ``--harness`` uses the chaos harness's own schedule instead.

    .venv/bin/python benchmarks/bench_prefix_resume.py --kills 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import rollvault
from rollvault.checkpoint_tools.chaos.checks import check_finished_run
from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    chaos_config,
    child_command,
    kill_delays,
    run_overrides,
)
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.controller.loop.journal_rows import SealJournalRecordError
from rollvault.controller.loop.seal_journal import (
    SEAL_JOURNAL_DIRNAME,
    PartialRecord,
    SealRecord,
    decode_replay,
)
from rollvault.durable.journal_format import read_journal

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


def _records(journal_dir: Path) -> list[object]:
    try:
        return [r.entry for r in decode_replay(read_journal(journal_dir))]
    except (SealJournalRecordError, OSError, ValueError):
        return []  # caught mid-write or before the journal exists


def _partial_tokens_in_flight(entries: list[object]) -> int:
    sealed = {e.gate_rollout_id for e in entries if isinstance(e, SealRecord)}
    newest: dict[str, int] = {}
    for entry in entries:
        if isinstance(entry, PartialRecord) and entry.gate_rollout_id not in sealed:
            newest[entry.gate_rollout_id] = len(entry.token_ids)
    return sum(newest.values())


def _kill_after_seal(plan: ChaosPlan, delays: list[float]) -> tuple[list[str], list[int]]:
    """Start, kill ``delay`` s after the start's first new seal record, repeat; then finish."""
    config = chaos_config(plan)
    plan.run_dir.mkdir(parents=True)
    journal_dir = Path(config.checkpointing.checkpoint_dir) / SEAL_JOURNAL_DIRNAME
    outcomes, in_flight = [], []
    with open(plan.run_dir / "child_output.log", "ab") as output:
        for delay in [*delays, None]:
            seals_before = sum(isinstance(e, SealRecord) for e in _records(journal_dir))
            child = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
                child_command(plan.config_path, run_overrides(plan)),
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=plan.run_dir,
            )
            try:
                if delay is None:
                    outcomes.append("finished" if child.wait(timeout=900) == 0 else "failed")
                    break
                while child.poll() is None:
                    seals = sum(isinstance(e, SealRecord) for e in _records(journal_dir))
                    if seals > seals_before:
                        break
                    time.sleep(0.05)
                time.sleep(delay)
                if child.poll() is not None:  # the run ended before the kill came
                    outcomes.append("finished" if child.returncode == 0 else "failed")
                    break
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                outcomes.append("killed")
                in_flight.append(_partial_tokens_in_flight(_records(journal_dir)))
            finally:
                if child.poll() is None:
                    os.kill(child.pid, signal.SIGKILL)
                    child.wait()
    return outcomes, in_flight


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
    in_flight: list[int] = []
    if args.harness:
        report = run_chaos(plan)
        starts = [s.outcome.value for s in report.starts]
        check, problems = report.check, report.problems
    else:
        delays = kill_delays(args.seed, args.kills, args.window)
        starts, in_flight = _kill_after_seal(plan, delays)
        check = check_finished_run(chaos_config(plan)) if starts[-1] == "finished" else None
        problems = check.problems if check is not None else ["the run did not finish"]
    seconds = time.perf_counter() - started
    restores = check.history.restores if check is not None else []
    return {
        "mode": mode,
        "starts": starts,
        "problems": problems,
        "unsealed_partial_tokens_at_kills": in_flight,
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
    parser.add_argument(
        "--window", type=float, default=3.0, help="kill delay: uniform in [0, window) s"
    )
    parser.add_argument("--harness", action="store_true", help="the harness's kill schedule")
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
