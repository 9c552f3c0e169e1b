"""``rollvault chaos``: kill a real ``rollvault run`` with SIGKILL, K times, and check it.

The harness starts ``rollvault run`` as a child process (on the packaged
config, whose simulated gate it slows down, or on ``--config FILE``, such as
the real GRPO recipe), with frequent rollout snapshots, trainer checkpoints every few
steps and a run that ends when its data runs out. Once the child has started
(its run-log directory counts the new incarnation), it waits a seeded random
delay and kills it with SIGKILL, then starts it again; after K kills it lets
the last start finish. Then it checks the run's evidence:

- on the effective history of the logs (:mod:`rollvault.checkpoint_tools.run_history`),
  every prompt of every epoch was trained exactly once or dropped, no group
  trained twice, a step trained again has the same prompts, and each group a
  restore kept finalized trained as itself;
- with no simulated failures, every sibling of every trained group was sealed
  exactly once, net of sealed work discarded on purpose (``prompt_group``); and
  under ``prompt_group`` no restore reused a sibling;
- the final snapshot holds no orphan rows: its staged rows are exactly those
  its ledger's sealed attempts own, its train rows exactly those of its replay
  index, and it has nothing left to generate or train.

It reports the work lost (tokens generated against tokens that reached
training). ``--compare`` runs the same kill schedule under ``restore_mode=latest``
and under the ``trainer_checkpoint`` baseline, and prints both and their ratio.
"""

from __future__ import annotations

import argparse
import enum
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import msgspec

from rollvault.checkpoint_tools.run_history import (
    PromptKey,
    RunHistory,
    WorkAccounting,
    check_exactly_once,
    check_sibling_reuse,
    read_run_history,
    work_accounting,
)
from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.overrides import parse_override
from rollvault.config.schema import RecoveryGranularity, RestoreMode, RunConfig
from rollvault.controller.loop.pipeline import INCARNATION_FILENAME
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, train_key
from rollvault.durable.errors import SnapshotError
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.recipes.async_grpo import prompt_dataset
from rollvault.tasks.registry import get_task

CHAOS_OVERRIDES: Final = (
    "dataset.num_prompts=48",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_epochs=2",
    "grpo.max_num_steps=1000000",
    "rollout.max_inflight_prompts=6",
    "rollout.max_buffered_rollouts=8",
    "gate.simulated.median_response_tokens=8",
    "gate.simulated.max_response_tokens=64",
    "gate.simulated.latency_per_token_s=0.01",
    "reward.max_response_tokens=48",
    "rollout_checkpointing.interval_s=0.2",
    "checkpointing.save_period=4",
)
"""The harness's run: several seconds long, snapshots every 0.2 s, a trainer
checkpoint every 4 steps, and an end by data exhaustion (2 epochs of 48 prompts).
User overrides come after these and win."""

HARNESS_OWNED_PATHS: Final = frozenset(
    {
        "logging.log_dir",
        "logging.progress",
        "checkpointing.checkpoint_dir",
        "rollout_checkpointing.restore_mode",
    }
)
"""Set by the harness for every start; an override of them is refused."""

CHILD_OUTPUT_FILENAME: Final = "child_output.log"
IN_FLIGHT_NOTE: Final = (
    "attempts in flight at a kill never reach attempts.jsonl, so 'logged' "
    "undercounts the work lost, by about the same number of tokens in both modes"
)
_POLL_S: Final = 0.01


class ChaosUsageError(ValueError):
    """The harness cannot run as asked (bad override, existing directory, endless run)."""


class StartOutcome(enum.StrEnum):
    """How one start of the child run ended."""

    KILLED = "killed"
    FINISHED = "finished"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class ChaosPlan:
    """One harness run: where, how many kills, and when."""

    run_dir: Path
    """Holds the run's ``logs/``, ``checkpoints/`` and the children's output; must not exist."""
    kills: int
    seed: int = 0
    restore_mode: RestoreMode = RestoreMode.LATEST
    overrides: tuple[str, ...] = ()
    config_path: Path | None = None
    """The run config file every start uses (None: the packaged default, simulated gate)."""
    kill_window_s: float = 1.0
    """Each kill comes a uniform random delay in [0, kill_window_s) after its start."""
    start_timeout_s: float = 120.0
    """A start that neither starts nor ends within this is killed and reported."""


@dataclass(frozen=True)
class StartRecord:
    """One start of ``rollvault run``."""

    number: int
    outcome: StartOutcome
    exit_code: int
    seconds: float
    """From spawn to exit."""
    kill_delay_s: float | None
    """Planned delay after the start was detected (None: let it finish)."""


@dataclass
class ChaosReport:
    """What a harness run did and every problem it found (empty: none)."""

    plan: ChaosPlan
    config: RunConfig
    starts: list[StartRecord] = field(default_factory=list)
    start_problems: list[str] = field(default_factory=list)
    check: RunCheck | None = None
    """None when the last start did not finish."""
    seconds: float = 0.0

    @property
    def kills_delivered(self) -> int:
        return sum(start.outcome is StartOutcome.KILLED for start in self.starts)

    @property
    def problems(self) -> list[str]:
        """Every problem found, with the starts or with the finished run."""
        return self.start_problems + (self.check.problems if self.check else [])


# -- the plan ------------------------------------------------------------------------


def kill_delays(seed: int, kills: int, window_s: float) -> list[float]:
    """The seeded kill schedule: one delay per kill, in seconds after each start."""
    rng = random.Random(seed)
    return [rng.uniform(0.0, window_s) for _ in range(kills)]


def chaos_config(plan: ChaosPlan) -> RunConfig:
    """The run config every start uses; raises :class:`ChaosUsageError` if unusable."""
    owned = sorted(
        path
        for path in (parse_override(o)[0] for o in plan.overrides)
        if path in HARNESS_OWNED_PATHS
    )
    if owned:
        raise ChaosUsageError(f"the harness sets {owned} itself; do not override them")
    if plan.kills < 0 or plan.kill_window_s <= 0 or plan.start_timeout_s <= 0:
        raise ChaosUsageError(
            f"kills ({plan.kills}) must be >= 0, kill_window_s ({plan.kill_window_s}) and "
            f"start_timeout_s ({plan.start_timeout_s}) > 0"
        )
    config = load_run_config(plan.config_path, run_overrides(plan))
    total = num_prompts(config) * config.grpo.max_num_epochs
    if config.grpo.max_num_steps < total:
        raise ChaosUsageError(
            f"grpo.max_num_steps ({config.grpo.max_num_steps}) must be at least the number of "
            f"prompts over all epochs ({total}), so that the run ends by data exhaustion and "
            "every prompt must be accounted for"
        )
    return config


def run_overrides(plan: ChaosPlan) -> list[str]:
    """The overrides every start passes to ``rollvault run``, the harness's own last."""
    run_dir = plan.run_dir.resolve()  # children run with the run dir as cwd
    return [
        *CHAOS_OVERRIDES,
        *plan.overrides,
        f"logging.log_dir={run_dir / 'logs'}",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        "logging.progress=false",
        f"rollout_checkpointing.restore_mode={plan.restore_mode.value}",
    ]


def num_prompts(config: RunConfig) -> int:
    """Prompts per epoch of the run: the length of its task's dataset.

    Raises :class:`~rollvault.tasks.registry.UnknownTaskError` (a ``ConfigError``)
    when ``dataset.kind`` names no task, before any child starts.
    """
    return len(prompt_dataset(config, get_task(config.dataset.kind)))


def expected_prompts(config: RunConfig) -> set[PromptKey]:
    """Every (epoch, sample id) a run that ends by data exhaustion must account for."""
    return {
        (epoch, str(idx))
        for epoch in range(config.grpo.max_num_epochs)
        for idx in range(num_prompts(config))
    }


def child_command(config_path: Path | None, config_overrides: Sequence[str]) -> list[str]:
    """The command line of one start: this interpreter running ``rollvault run``."""
    # Children run with the run dir as cwd, so a relative config path is resolved here.
    config = ["--config", str(config_path.resolve())] if config_path is not None else []
    return [sys.executable, "-m", "rollvault.cli.main", "run", *config, *config_overrides]


# -- driving the child ---------------------------------------------------------------


def run_chaos(plan: ChaosPlan) -> ChaosReport:
    """Start, kill and restart the run as planned, let it finish, then check it."""
    config = chaos_config(plan)
    if plan.run_dir.exists():
        raise ChaosUsageError(f"{plan.run_dir} exists; the harness needs a fresh directory")
    plan.run_dir.mkdir(parents=True)
    report = ChaosReport(plan=plan, config=config)
    started = time.perf_counter()
    overrides = run_overrides(plan)
    delays: list[float | None] = [*kill_delays(plan.seed, plan.kills, plan.kill_window_s), None]
    with open(plan.run_dir / CHILD_OUTPUT_FILENAME, "ab") as output:
        for number, delay in enumerate(delays, start=1):
            record = _one_start(plan, config, overrides, number, delay, output)
            report.starts.append(record)
            if record.outcome is not StartOutcome.KILLED:
                break
    report.start_problems = _start_problems(report)
    if report.starts[-1].outcome is StartOutcome.FINISHED:
        report.check = check_finished_run(config)
    report.seconds = time.perf_counter() - started
    return report


def _one_start(
    plan: ChaosPlan,
    config: RunConfig,
    overrides: list[str],
    number: int,
    kill_delay: float | None,
    output: IO[bytes],
) -> StartRecord:
    incarnation_path = Path(config.logging.log_dir) / INCARNATION_FILENAME
    before = _read_incarnation(incarnation_path)
    output.write(f"\n=== start {number} (kill delay {kill_delay}) ===\n".encode())
    output.flush()
    spawned = time.perf_counter()
    child = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
        child_command(plan.config_path, overrides),
        stdout=output,
        stderr=subprocess.STDOUT,
        cwd=plan.run_dir,
    )
    try:
        outcome = _supervise(child, plan, incarnation_path, before, kill_delay)
    finally:
        _kill_if_running(child)
    return StartRecord(
        number=number,
        outcome=outcome,
        exit_code=child.returncode,
        seconds=time.perf_counter() - spawned,
        kill_delay_s=kill_delay,
    )


def _supervise(
    child: subprocess.Popen[bytes],
    plan: ChaosPlan,
    incarnation_path: Path,
    before: int,
    kill_delay: float | None,
) -> StartOutcome:
    deadline = time.monotonic() + plan.start_timeout_s
    started = kill_delay is not None and _wait_for_start(child, incarnation_path, before, deadline)
    if started and kill_delay is not None and _exited_within(child, kill_delay) is None:
        _kill_if_running(child)
        return StartOutcome.KILLED
    exit_code = _exited_within(child, max(0.0, deadline - time.monotonic()))
    if exit_code is None:
        return StartOutcome.TIMED_OUT
    return StartOutcome.FINISHED if exit_code == 0 else StartOutcome.FAILED


def _wait_for_start(
    child: subprocess.Popen[bytes], incarnation_path: Path, before: int, deadline: float
) -> bool:
    """Whether the child counted its incarnation (False: it exited or timed out first)."""
    while time.monotonic() < deadline:
        if _read_incarnation(incarnation_path) > before:
            return True
        if _exited_within(child, _POLL_S) is not None:
            return False
    return False


def _exited_within(child: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The child's exit code if it exits within ``seconds``, else None."""
    try:
        return child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _kill_if_running(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child we started, unless it already exited, and reap it."""
    # poll() reaps an exited child; until it is reaped its pid cannot be reused,
    # so the kill below can only reach our own child.
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def _read_incarnation(path: Path) -> int:
    # Written by atomic rename, so a read sees the old or the new count, never half.
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return 0


def _start_problems(report: ChaosReport) -> list[str]:
    problems = []
    last = report.starts[-1]
    if last.outcome is StartOutcome.FAILED:
        problems.append(
            f"start {last.number} exited with code {last.exit_code}; its output is in "
            f"{report.plan.run_dir / CHILD_OUTPUT_FILENAME}"
        )
    elif last.outcome is StartOutcome.TIMED_OUT:
        problems.append(
            f"start {last.number} did not finish within {report.plan.start_timeout_s:.0f}s"
        )
    if report.kills_delivered < report.plan.kills:
        problems.append(
            f"only {report.kills_delivered} of {report.plan.kills} kills landed before the run "
            "ended; lengthen the run (e.g. more dataset.num_prompts) or shorten --kill-window"
        )
    return problems


# -- checking the evidence -----------------------------------------------------------


@dataclass(frozen=True)
class RunCheck:
    """The invariants checked on a finished run, and its work accounting."""

    problems: list[str]
    history: RunHistory
    accounting: WorkAccounting
    final_snapshot: Path | None


def check_finished_run(config: RunConfig) -> RunCheck:
    """Check the logs and the final snapshot of the finished run ``config`` describes."""
    history = read_run_history(Path(config.logging.log_dir))
    problems = check_exactly_once(history, expected_prompts(config))
    problems += reuse_problems(history, config)
    final_problems, final_snapshot = final_state_problems(config)
    return RunCheck(
        problems=problems + final_problems,
        history=history,
        accounting=work_accounting(history),
        final_snapshot=final_snapshot,
    )


def reuse_problems(history: RunHistory, config: RunConfig) -> list[str]:
    """Sealed siblings were reused, or redone whole under ``prompt_group``, as configured."""
    gate = config.gate.simulated
    problems = []
    # With simulated failures a sibling may legitimately be sealed, discarded and redone.
    if gate.transient_failure_rate == 0.0 and gate.permanent_failure_rate == 0.0:
        problems += check_sibling_reuse(history)
    if config.rollout.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        problems += [
            f"start {r.incarnation} reused {r.siblings_reused} siblings under prompt_group"
            for r in history.restores
            if r.siblings_reused
        ]
    return problems


def final_state_problems(config: RunConfig) -> tuple[list[str], Path | None]:
    """Problems of the snapshot a next start would restore, and its path."""
    # Whatever mode the run used, its newest snapshot is its final state.
    latest = msgspec.structs.replace(
        config,
        rollout_checkpointing=msgspec.structs.replace(
            config.rollout_checkpointing, restore_mode=RestoreMode.LATEST
        ),
    )
    try:
        source = prepare_checkpoint_dir(latest)
    except SnapshotError as error:
        return [f"the final state cannot be restored: {error}"], None
    if source is None or source.snapshot is None:
        return ["the finished run left no rollout snapshot to check"], None
    snapshot = source.snapshot
    problems = _fallback_problems(snapshot.path)
    problems += snapshot_problems(snapshot, config.grpo.num_generations_per_prompt)
    return problems, snapshot.path


def _fallback_problems(chosen: Path) -> list[str]:
    """A finished run's newest committed snapshot must be usable: restore chose ``chosen``."""
    in_snapshots = chosen.parent == snapshots_root(chosen.parent.parent)
    anchor = chosen.parent.parent if in_snapshots else chosen.parent
    committed = committed_snapshot_paths(snapshots_root(anchor))
    if committed and committed[-1] != chosen:
        return [
            f"the newest snapshot {committed[-1]} was rejected (see the warnings); restore chose {chosen}"
        ]
    return []


def snapshot_problems(snapshot: LoadedSnapshot, generations_per_group: int) -> list[str]:
    """Orphan or missing rows, and work left undone, in a finished run's snapshot.

    Staged rows must be exactly those the ledger's sealed attempts own, and
    train rows exactly those of the replay index's groups; no group may be
    left in the ledger, and the replay index may hold only the groups
    trained since the last trainer checkpoint (kept for a rollback).
    """
    ledger = RolloutRecoveryLedger.from_state_dict(dict(snapshot.recovery.ledger_state))
    rows = snapshot.data_plane.partitions
    entries = snapshot.replay.replay.entries
    canonical = {train_key(e.group_id, i) for e in entries for i in range(generations_per_group)}
    problems = _row_problems(
        STAGING_PARTITION, set(rows.get(STAGING_PARTITION, {})), ledger.expected_staging_keys()
    )
    problems += _row_problems(TRAIN_PARTITION, set(rows.get(TRAIN_PARTITION, {})), canonical)
    if len(ledger):
        problems.append(f"{len(ledger)} groups are still in the ledger, unfinished")
    untrained = len(entries) - snapshot.manifest.rolled_back_train_group_count
    if untrained:
        problems.append(f"{untrained} finalized groups were never trained")
    return [f"{snapshot.path}: {problem}" for problem in problems]


def _row_problems(partition: str, held: set[str], referenced: set[str]) -> list[str]:
    orphans = [
        f"{partition} row {key} is referenced by nothing" for key in sorted(held - referenced)
    ]
    missing = [
        f"{partition} row {key} is referenced but absent" for key in sorted(referenced - held)
    ]
    return orphans + missing


# -- reporting -----------------------------------------------------------------------


def format_report(report: ChaosReport) -> str:
    """A readable account of one harness run."""
    plan = report.plan
    lines = [
        f"rollvault chaos: restore_mode={plan.restore_mode.value}, {plan.kills} kills planned, "
        f"seed {plan.seed}, run dir {plan.run_dir}",
    ]
    lines += [_format_start(start) for start in report.starts]
    if report.check is not None:
        lines.append(_format_restores(report.check.history))
        lines.append(_format_work(report.check.accounting))
        lines.append(f"  final snapshot checked: {report.check.final_snapshot}")
    lines.append(
        f"  {report.kills_delivered} kills, {len(report.starts)} starts, {report.seconds:.1f}s"
    )
    if report.problems:
        lines.append(f"FAILED: {len(report.problems)} problems")
        lines += [f"  - {problem}" for problem in report.problems]
    else:
        lines.append(
            "OK: every prompt trained exactly once, sealed work reused as configured, no orphan rows"
        )
    return "\n".join(lines)


def _format_start(start: StartRecord) -> str:
    planned = (
        ""
        if start.kill_delay_s is None
        else f" (kill planned {start.kill_delay_s:.2f}s after start)"
    )
    return (
        f"  start {start.number:2d}: {start.outcome.value}, exit {start.exit_code}, "
        f"{start.seconds:.2f}s{planned}"
    )


def _format_restores(history: RunHistory) -> str:
    from_snapshot = sum(r.snapshot is not None for r in history.restores)
    return (
        f"  restores: {len(history.restores)} ({from_snapshot} from a snapshot), "
        f"siblings reused {sum(r.siblings_reused for r in history.restores)}, "
        f"attempts redispatched {sum(r.attempts_redispatched for r in history.restores)}, "
        f"groups regenerated {sum(r.groups_regenerated for r in history.restores)}, "
        f"rows dropped {sum(r.rows_dropped for r in history.restores)}"
    )


def _format_work(accounting: WorkAccounting) -> str:
    share = (
        accounting.lost_tokens / accounting.generated_tokens if accounting.generated_tokens else 0.0
    )
    return (
        f"  work: {accounting.generated_tokens} tokens generated, {accounting.trained_tokens} "
        f"trained, {accounting.lost_tokens} lost ({share:.1%})"
    )


def lost_work_ratio(latest_lost: int, baseline_lost: int) -> float:
    """Tokens the baseline regenerated per token ``latest`` regenerated (inf if none)."""
    if latest_lost == 0:
        return float("inf") if baseline_lost else 1.0
    return baseline_lost / latest_lost


def inflight_estimate(report: ChaosReport) -> int:
    """Tokens of unfinished attempts the kills threw away, estimated (logs never see them).

    Assumes every attempt slot (``max_inflight_prompts`` x siblings) was busy
    and half done at each kill, with the mean length of the sealed attempts.
    The same for every restore mode: a kill loses in-flight work either way.
    """
    if report.check is None:
        return 0
    sealed = [
        a.num_tokens
        for a in report.check.history.attempts
        if a.status is RolloutAttemptStatus.SEALED
    ]
    mean = sum(sealed) / len(sealed) if sealed else 0.0
    config = report.config
    slots = config.rollout.max_inflight_prompts * config.grpo.num_generations_per_prompt
    return round(report.kills_delivered * slots * mean / 2)


def format_comparison(latest: ChaosReport, baseline: ChaosReport) -> str:
    """Both modes' work lost under the same kill schedule, and their ratio."""
    if latest.check is None or baseline.check is None:
        return "comparison: unavailable (a run did not finish)"
    lost = [latest.check.accounting.lost_tokens, baseline.check.accounting.lost_tokens]
    with_inflight = [lost[0] + inflight_estimate(latest), lost[1] + inflight_estimate(baseline)]
    return "\n".join(
        [
            f"tokens regenerated under the same {latest.plan.kills} kills (seed {latest.plan.seed}):",
            "                       logged   logged + in-flight estimate",
            f"  latest:             {lost[0]:7d}   {with_inflight[0]:7d}",
            f"  trainer_checkpoint: {lost[1]:7d}   {with_inflight[1]:7d}",
            f"  ratio:              {lost_work_ratio(*lost):6.1f}x   "
            f"{lost_work_ratio(*with_inflight):6.1f}x",
            f"  note: {IN_FLIGHT_NOTE}; the estimate assumes every attempt slot busy and half "
            "done at each kill",
        ]
    )


# -- command line --------------------------------------------------------------------


def add_chaos_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``chaos`` subcommand's options."""
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs before the last start")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill schedule")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--restore-mode",
        choices=[RestoreMode.LATEST.value, RestoreMode.TRAINER_CHECKPOINT.value],
        default=RestoreMode.LATEST.value,
    )
    modes.add_argument(
        "--compare",
        action="store_true",
        help="run the same kills under latest and trainer_checkpoint and compare work lost",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument(
        "--config", type=Path, default=None, help="YAML run config (default: the packaged one)"
    )
    parser.add_argument("--kill-window", type=float, default=1.0, help="max seconds to a kill")
    parser.add_argument("--timeout", type=float, default=120.0, help="max seconds per start")
    parser.add_argument("overrides", nargs="*", help="dotpath=value overrides of the run config")


def chaos_command(args: argparse.Namespace) -> int:
    """Run the harness as the command line asked; 0 when no invariant failed."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rollvault-chaos-"))
    modes = (
        [RestoreMode.LATEST, RestoreMode.TRAINER_CHECKPOINT]
        if args.compare
        else [RestoreMode(args.restore_mode)]
    )
    reports = []
    for mode in modes:
        plan = ChaosPlan(
            run_dir=workdir / mode.value,
            kills=args.kills,
            seed=args.seed,
            restore_mode=mode,
            overrides=tuple(args.overrides),
            config_path=args.config,
            kill_window_s=args.kill_window,
            start_timeout_s=args.timeout,
        )
        try:
            reports.append(run_chaos(plan))
        except (ChaosUsageError, ConfigError) as error:
            print(f"rollvault chaos: {error}", file=sys.stderr)
            return 2
        print(format_report(reports[-1]), flush=True)
    if args.compare:
        print(format_comparison(reports[0], reports[1]))
    else:
        print(f"  note: {IN_FLIGHT_NOTE}")
    return 1 if any(report.problems for report in reports) else 0
