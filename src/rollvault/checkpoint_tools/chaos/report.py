"""What a harness run did, and its account as text."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from rollvault.checkpoint_tools.chaos.checks import RunCheck
from rollvault.checkpoint_tools.chaos.kill_evidence import KillEvidence
from rollvault.checkpoint_tools.chaos.loss import LossAccount
from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.run_history import EpochAccount, RunHistory, WorkAccounting
from rollvault.config.schema import RunConfig

IN_FLIGHT_NOTE: Final = (
    "attempts in flight at a kill never reach attempts.jsonl, so 'logged' undercounts the "
    "work lost; '+ in flight' adds them, measured at each kill (dispatched and never "
    "returned, each at its redo's length: an upper bound)"
)


class StartOutcome(enum.StrEnum):
    """How one start of the child run ended."""

    KILLED = "killed"
    FINISHED = "finished"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class StartRecord:
    """One start of ``rollvault run``."""

    number: int
    outcome: StartOutcome
    exit_code: int
    seconds: float
    """From spawn to exit."""
    kill_delay_s: float | None
    """Planned delay after the start was detected (None: no timer kill)."""
    kill_after_steps: int | None = None
    """Planned train steps of this start before its kill (None: no progress-based kill)."""


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
    kill_evidence: list[KillEvidence] = field(default_factory=list)
    """What each kill left on disk, read before the next start."""
    loss: LossAccount | None = None
    """The lost tokens by kill and kind (None when the last start did not finish)."""

    @property
    def kills_delivered(self) -> int:
        return sum(start.outcome is StartOutcome.KILLED for start in self.starts)

    @property
    def problems(self) -> list[str]:
        """Every problem found, with the starts or with the finished run."""
        return self.start_problems + (self.check.problems if self.check else [])


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
        if report.loss is not None:
            lines += format_loss(report.loss)
        lines += [_format_epoch(account) for account in report.check.epochs]
        lines.append(f"  final snapshot checked: {report.check.final_snapshot}")
    lines.append(
        f"  {report.kills_delivered} kills, {len(report.starts)} starts, {report.seconds:.1f}s"
    )
    if report.problems:
        lines.append(f"FAILED: {len(report.problems)} problems")
        lines += [f"  - {problem}" for problem in report.problems]
    else:
        lines.append(
            "OK: every prompt trained exactly once (or dropped, or pending), sealed work reused "
            "as configured, no orphan rows"
        )
    return "\n".join(lines)


def _format_start(start: StartRecord) -> str:
    planned = ""
    if start.kill_delay_s is not None:
        planned = f" (kill planned {start.kill_delay_s:.2f}s after start)"
    elif start.kill_after_steps is not None:
        planned = f" (kill planned after {start.kill_after_steps} train steps of its own)"
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


def _format_epoch(account: EpochAccount) -> str:
    lost = f", {account.unaccounted} LOST" if account.unaccounted else ""
    return (
        f"  epoch {account.epoch}: {account.expected} prompts, {account.trained} trained, "
        f"{account.dropped} dropped, {account.pending} pending{lost}"
    )


def _format_work(accounting: WorkAccounting) -> str:
    share = (
        accounting.lost_tokens / accounting.generated_tokens if accounting.generated_tokens else 0.0
    )
    return (
        f"  work: {accounting.generated_tokens} tokens generated, {accounting.trained_tokens} "
        f"trained, {accounting.lost_tokens} lost ({share:.1%})"
    )


def format_loss(loss: LossAccount) -> list[str]:
    """The lost tokens by kind, measured at each kill (see :mod:`.loss`)."""
    lines = [
        "  lost per kill (tokens: in flight [attempts] / sealed not yet durable / "
        "durable, dropped by the retry budget / durable, lost):"
    ]
    lines += [
        f"    start {kill.start:2d}: {kill.in_flight_tokens} [{kill.in_flight_attempts}] / "
        f"{kill.not_durable_tokens} / {kill.dropped_tokens} / {kill.durable_lost_tokens}"
        for kill in loss.kills
    ]
    lines.append(
        f"  measured: {loss.total('in_flight_tokens')} tokens in flight at the kills "
        f"({loss.total('in_flight_unmatched')} attempts never redone, at the mean), "
        f"{loss.total('not_durable_tokens')} sealed not yet durable, "
        f"{loss.total('dropped_tokens')} durable but dropped, "
        f"{loss.total('durable_lost_tokens')} durable and lost, "
        f"{loss.after_last_kill_tokens} after the last kill; total lost / (in flight + "
        f"not durable) = {loss.limit_ratio():.2f} ({loss.limit_ratio(0.5):.2f} with in-flight "
        "attempts half done)"
    )
    return lines


def lost_work_ratio(latest_lost: int, baseline_lost: int) -> float:
    """Tokens the baseline regenerated per token ``latest`` regenerated (inf if none)."""
    if latest_lost == 0:
        return float("inf") if baseline_lost else 1.0
    return baseline_lost / latest_lost


def inflight_measured(report: ChaosReport) -> int:
    """Tokens of the attempts in flight at the kills, measured (0 if the run did not finish).

    Each kill's evidence names them (:mod:`.kill_evidence`); each counts its
    redo's tokens, an upper bound of what it had generated (:mod:`.loss`).
    """
    return report.loss.total("in_flight_tokens") if report.loss is not None else 0


def format_comparison(latest: ChaosReport, baseline: ChaosReport) -> str:
    """Both modes' work lost under the same kill schedule, and their ratio."""
    if latest.check is None or baseline.check is None:
        return "comparison: unavailable (a run did not finish)"
    lost = [latest.check.accounting.lost_tokens, baseline.check.accounting.lost_tokens]
    with_inflight = [lost[0] + inflight_measured(latest), lost[1] + inflight_measured(baseline)]
    return "\n".join(
        [
            f"tokens regenerated under the same {latest.plan.kills} kills (seed {latest.plan.seed}):",
            "                       logged   logged + in flight (measured)",
            f"  latest:             {lost[0]:7d}   {with_inflight[0]:7d}",
            f"  trainer_checkpoint: {lost[1]:7d}   {with_inflight[1]:7d}",
            f"  ratio:              {lost_work_ratio(*lost):6.1f}x   "
            f"{lost_work_ratio(*with_inflight):6.1f}x",
            f"  note: {IN_FLIGHT_NOTE}",
        ]
    )
