"""The end of ``rollvault run``: a one-screen summary and a plot of reward and accuracy.

Also the line printed once the policy is prepared, saying where this start's
version-0 weights came from (warmed up now, or the saved version-0 policy).

Both read the run's logs, so they cover every start of the run, not only
this one: ``metrics.jsonl`` for the curves (the last line of each step wins,
so a step retrained after a restore shows its final training) and
``restores.jsonl`` for the restores, which the plot marks at the step each
one resumed from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rollvault.cli.metrics_log import MetricsRecord, effective_metrics
from rollvault.controller.loop.pipeline import RunSummary
from rollvault.controller.loop.run_logs import RestoreLogRecord
from rollvault.recipes.run_parts import PolicyStart

if TYPE_CHECKING:
    from rollvault.training.warmup import WarmupReport

__all__ = ["PLOT_FILENAME", "plot_run", "policy_line", "summary_lines"]

PLOT_FILENAME = "reward_accuracy.png"
_WINDOW = 20
_SMOOTHING = 10


def _window_mean(records: Sequence[MetricsRecord], name: str) -> float | None:
    values = [v for r in records if (v := r.metric(name)) is not None]
    return float(np.mean(values)) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def policy_line(
    start: PolicyStart, *, warmup: WarmupReport | None, version_zero: Path
) -> str | None:
    """Where this start's version-0 policy came from; None when it is just ``model.path``."""
    if start is PolicyStart.SAVED:
        return (
            f"policy: version 0 loaded from {version_zero}, saved after the warm-up of an "
            "earlier start (no warm-up this start)"
        )
    if start is PolicyStart.TRAINER_CHECKPOINT:
        return "policy: the newest trainer checkpoint's (no warm-up this start)"
    if start is PolicyStart.WARM_UP and warmup is not None:
        return (
            f"policy: warmed up by this start ({warmup.steps} supervised steps, loss "
            f"{warmup.first_loss:.3f} -> {warmup.final_loss:.3f}, {warmup.seconds:.1f}s); "
            f"it is saved as version 0 to {version_zero} before the first rollout"
        )
    return None


def summary_lines(
    summary: RunSummary,
    *,
    elapsed_s: float,
    metrics: Sequence[MetricsRecord],
    restores: Sequence[RestoreLogRecord],
    warmup: WarmupReport | None,
    this_start_steps: int,
) -> list[str]:
    """The final summary, a dozen lines at most."""
    steps = effective_metrics(list(metrics))
    first, last = steps[:_WINDOW], steps[-_WINDOW:]
    mine = [r for r in metrics if r.incarnation == summary.incarnation]
    seconds = sum(r.step_seconds for r in mine)
    lines = [
        f"rollvault run (start {summary.incarnation}): trainer at step {summary.trainer_version}, "
        f"{this_start_steps} steps this start in {elapsed_s:.1f}s",
    ]
    if warmup is not None:
        lines.append(
            f"  warm-up: {warmup.steps} supervised steps, loss {warmup.first_loss:.3f} -> "
            f"{warmup.final_loss:.3f}, {warmup.seconds:.1f}s"
        )
    for name, label, spec in (("reward_mean", "reward", ".3f"), ("accuracy", "accuracy", ".1%")):
        if any(r.metric(name) is not None for r in steps):
            lines.append(
                f"  {label:8s} first {len(first)} steps {_fmt(_window_mean(first, name), spec)}"
                f"   last {len(last)} steps {_fmt(_window_mean(last, name), spec)}"
            )
    if mine and seconds > 0:
        tokens = sum(r.rollout_tokens_per_s * r.step_seconds for r in mine)
        lines.append(
            f"  throughput this start: {tokens / seconds:,.0f} rollout tokens/s, "
            f"{len(mine) / seconds:.2f} train steps/s"
        )
    lines.append(
        f"  groups trained {summary.trained_groups}, dropped {summary.dropped_groups}, "
        f"failures infra={summary.infra_failures} data={summary.data_failures}"
    )
    if summary.pending:
        reasons = ", ".join(
            f"{reason} {count}" for reason, count in sorted(summary.pending.items())
        )
        lines.append(
            f"  prompts pending {summary.pending_prompts} (the step budget ended the run before "
            f"they trained: {reasons}; see pending.jsonl)"
        )
    for restore in restores:
        lines.append(
            f"  restore at start {restore.incarnation} ({restore.restore_mode}): resumed at step "
            f"{restore.base_train_step}, kept {len(restore.canonical_group_ids)} finalized groups "
            f"and {restore.siblings_reused} sealed siblings, redispatched "
            f"{restore.attempts_redispatched} attempts, {restore.seconds:.2f}s"
        )
        lines += [f"    skipped {skipped}" for skipped in restore.skipped]
    return lines


def plot_run(
    metrics: Sequence[MetricsRecord], restores: Sequence[RestoreLogRecord], path: Path
) -> Path | None:
    """Write the reward/accuracy curves to ``path`` (PNG); None when there is nothing to plot."""
    steps = effective_metrics(list(metrics))
    series = {
        name: [(r.step, v) for r in steps if (v := r.metric(name)) is not None]
        for name in ("reward_mean", "accuracy")
    }
    if not any(series.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none assumed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.8))
    colors = {"reward_mean": "tab:blue", "accuracy": "tab:green"}
    for name, points in series.items():
        if not points:
            continue
        x, y = (np.asarray(values, dtype=float) for values in zip(*points, strict=True))
        axes.plot(x, y, color=colors[name], alpha=0.25, linewidth=0.8)
        axes.plot(x, _smooth(y), color=colors[name], linewidth=1.8, label=_label(name))
    starts_by_step: dict[int, list[int]] = {}
    for restore in restores:
        starts_by_step.setdefault(restore.base_train_step, []).append(restore.incarnation)
    for step, starts in sorted(starts_by_step.items()):
        axes.axvline(step, color="tab:red", linestyle="--", linewidth=1.0)
        label = "start" if len(starts) == 1 else "starts"
        axes.annotate(
            f"restore ({label} {', '.join(map(str, starts))})",
            xy=(step, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color="tab:red",
        )
    axes.set_xlabel("optimizer step")
    axes.set_title("rollvault: reward and accuracy per step")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _smooth(values: np.ndarray) -> np.ndarray:
    """Trailing mean over the last ``_SMOOTHING`` points."""
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), _SMOOTHING)
    starts = np.arange(1, len(values) + 1) - counts
    result: np.ndarray = (cumulative[1:] - cumulative[starts]) / counts
    return result


def _label(name: str) -> str:
    return {
        "reward_mean": f"reward (mean of {_SMOOTHING} steps)",
        "accuracy": f"accuracy (mean of {_SMOOTHING} steps)",
    }[name]
