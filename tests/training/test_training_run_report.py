"""What ``rollvault run`` leaves for people: metrics.jsonl, the summary, the plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rollvault.cli.metrics_log import (
    METRICS_LOG_FILENAME,
    MetricsRecord,
    MetricsWriter,
    TensorBoardMirror,
    effective_metrics,
    finite_metrics,
    read_metrics,
)
from rollvault.cli.run_command import run_command
from rollvault.cli.run_report import PLOT_FILENAME, plot_run, policy_line, summary_lines
from rollvault.config.loading import load_run_config
from rollvault.controller.loop.pipeline import RunSummary
from rollvault.controller.loop.run_logs import RestoreLogRecord
from rollvault.recipes.async_grpo import PolicyStart
from rollvault.training.warmup import WarmupReport


def _record(
    step: int, incarnation: int = 1, reward: float = 0.5, **trainer: float
) -> MetricsRecord:
    return MetricsRecord(
        step=step,
        incarnation=incarnation,
        time=1000.0 + step,
        step_seconds=0.5,
        rollout_tokens_per_s=100.0,
        groups_in_flight=3,
        buffered_groups=1,
        snapshot_age_s=None,
        trainer={"reward_mean": reward, "accuracy": reward / 2, **trainer},
    )


def _restore(incarnation: int, step: int) -> RestoreLogRecord:
    return RestoreLogRecord(
        incarnation=incarnation,
        restore_mode="latest",
        snapshot="snap",
        restored_seq=1,
        base_train_step=step,
        canonical_group_ids=["a", "b"],
        siblings_reused=3,
        attempts_redispatched=4,
        groups_regenerated=0,
        rows_dropped=0,
        seconds=0.1,
    )


def test_metrics_lines_survive_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / METRICS_LOG_FILENAME
    writer = MetricsWriter(path)
    writer.write(_record(0))
    writer.write(_record(1))
    writer.close()
    with open(path, "ab") as handle:
        handle.write(b'{"step": 2, "incarn')  # a SIGKILL mid-line
    assert [r.step for r in read_metrics(path)] == [0, 1]
    writer = MetricsWriter(path)  # the next start cuts the torn line off
    writer.write(_record(2, incarnation=2))
    writer.close()
    assert [r.step for r in read_metrics(path)] == [0, 1, 2]
    lines = path.read_bytes().split(b"\n")
    lines.insert(1, b"{damaged")
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=":2: damaged metrics line"):
        read_metrics(path)


def test_a_retrained_step_counts_once_with_its_last_training() -> None:
    records = [_record(0, 1, 0.1), _record(1, 1, 0.2), _record(1, 2, 0.9), _record(2, 2, 0.3)]
    assert [(r.step, r.incarnation) for r in effective_metrics(records)] == [(0, 1), (1, 2), (2, 2)]
    assert finite_metrics({"a": 1.0, "b": float("nan"), "c": float("inf")}) == {"a": 1.0}


def test_summary_compares_the_first_and_last_steps_and_lists_restores() -> None:
    records = [_record(step, reward=0.1 if step < 20 else 0.7) for step in range(40)]
    summary = RunSummary(
        incarnation=1,
        trainer_version=40,
        trained_groups=80,
        dropped_groups=0,
        shortfall={},
        infra_failures=1,
        data_failures=0,
        groups_in_flight=0,
        staging_rows_left=0,
        snapshots_written=3,
        trainer_checkpoints=1,
    )
    lines = summary_lines(
        summary,
        elapsed_s=12.0,
        metrics=records,
        restores=[_restore(2, 10)],
        warmup=None,
        this_start_steps=40,
    )
    text = "\n".join(lines)
    assert "reward   first 20 steps 0.100   last 20 steps 0.700" in text
    assert "accuracy first 20 steps 5.0%   last 20 steps 35.0%" in text
    assert "2.00 train steps/s" in text and "infra=1" in text
    assert "resumed at step 10, kept 2 finalized groups and 3 sealed siblings" in text
    assert len(lines) <= 12


def test_the_plot_is_a_png_and_needs_rewards(tmp_path: Path) -> None:
    records = [_record(step, reward=step / 50) for step in range(50)]
    path = plot_run(records, [_restore(2, 20), _restore(3, 20)], tmp_path / PLOT_FILENAME)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bare = [
        MetricsRecord(
            **{**{f: getattr(r, f) for f in r.__struct_fields__}, "trainer": {"tokens": 1.0}}
        )
        for r in records
    ]
    assert plot_run(bare, [], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_simulated_run_writes_one_metrics_line_per_step(tmp_path: Path) -> None:
    config = load_run_config(
        None,
        [
            "dataset.num_prompts=16",
            "grpo.num_prompts_per_step=4",
            "grpo.max_num_steps=4",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "logging.progress=false",
        ],
    )
    assert run_command(config) == 0
    records = read_metrics(tmp_path / "logs" / METRICS_LOG_FILENAME)
    assert [r.step for r in records] == [0, 1, 2, 3]
    assert all(r.incarnation == 1 and r.trainer["groups"] == 4 for r in records)
    assert all(r.rollout_tokens_per_s >= 0 for r in records)
    # The recording trainer reports no reward: nothing to plot.
    assert not (tmp_path / "logs" / PLOT_FILENAME).exists()
    json.loads((tmp_path / "logs" / METRICS_LOG_FILENAME).read_text().splitlines()[0])


def _scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_the_tensorboard_mirror_writes_every_scalar_of_every_step(tmp_path: Path) -> None:
    mirror = TensorBoardMirror(tmp_path)
    assert mirror.unavailable_reason is None
    for step in range(3):
        mirror.write(_record(step, reward=0.25 * step, loss=1.0 - 0.1 * step))
    mirror.close()
    scalars = _scalars(tmp_path / "tensorboard")
    assert scalars["trainer/reward_mean"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [step for step, _ in scalars["trainer/loss"]] == [0, 1, 2]
    assert scalars["trainer/loss"][2][1] == pytest.approx(0.8)
    assert scalars["rollout_tokens_per_s"] == [(s, 100.0) for s in range(3)]
    assert scalars["groups_in_flight"] == [(s, 3.0) for s in range(3)]


def test_without_tensorboard_the_mirror_says_why_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An entry of None in sys.modules makes the import fail, as when the package is absent.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    mirror = TensorBoardMirror(tmp_path)
    assert mirror.unavailable_reason is not None
    assert "tensorboard is not installed" in mirror.unavailable_reason
    mirror.write(_record(0))
    mirror.close()
    assert not (tmp_path / "tensorboard").exists()


def test_the_policy_line_says_where_version_zero_came_from(tmp_path: Path) -> None:
    saved = tmp_path / "ckpt" / "bootstrap" / "policy"
    warmup = WarmupReport(steps=30, first_loss=2.5, final_loss=0.75, seconds=1.25)
    assert policy_line(PolicyStart.WARM_UP, warmup=warmup, version_zero=saved) == (
        "policy: warmed up by this start (30 supervised steps, loss 2.500 -> 0.750, 1.2s); "
        f"it is saved as version 0 to {saved} before the first rollout"
    )
    assert policy_line(PolicyStart.SAVED, warmup=None, version_zero=saved) == (
        f"policy: version 0 loaded from {saved}, saved after the warm-up of an earlier start "
        "(no warm-up this start)"
    )
    line = policy_line(PolicyStart.TRAINER_CHECKPOINT, warmup=None, version_zero=saved)
    assert line == "policy: the newest trainer checkpoint's (no warm-up this start)"
    assert policy_line(PolicyStart.MODEL, warmup=None, version_zero=saved) is None
