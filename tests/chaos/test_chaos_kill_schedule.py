"""The progress-based kill schedule: kills after a seeded number of train steps of each start.

The plan's validation, the seeded schedule, the watch that counts a start's
train steps in ``train_log.jsonl``, the command line's ``--kill-after-steps``,
and a real run whose own logs show that every kill came after its start
trained the steps drawn for it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest

from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    ChaosUsageError,
    StepsKill,
    TimerKill,
    chaos_config,
    kill_delays,
    kill_schedule,
    kill_step_counts,
)
from rollvault.checkpoint_tools.chaos.progress import TrainStepWatch
from rollvault.checkpoint_tools.chaos.report import StartOutcome, format_report
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.cli.chaos_command import parse_step_range
from rollvault.cli.main import main
from rollvault.controller.loop.run_logs import TRAIN_LOG_FILENAME, TrainLogRecord, read_jsonl

# -- the plan ---------------------------------------------------------------------------


def _steps_plan(tmp_path: Path, steps: tuple[int, int] = (1, 3)) -> ChaosPlan:
    return ChaosPlan(
        run_dir=tmp_path / "run", kills=4, seed=9, kill_window_s=None, kill_after_steps=steps
    )


def test_the_plan_takes_exactly_one_usable_schedule(tmp_path: Path) -> None:
    plan = _steps_plan(tmp_path)
    assert chaos_config(plan).grpo.max_num_epochs == 2
    both = dataclasses.replace(plan, kill_window_s=1.0)
    with pytest.raises(ChaosUsageError, match=r"kill_window_s \(1.0\) and kill_after_steps"):
        chaos_config(both)
    neither = dataclasses.replace(plan, kill_after_steps=None)
    with pytest.raises(ChaosUsageError, match="neither kill_window_s nor kill_after_steps"):
        chaos_config(neither)
    for bad in [(3, 1), (-1, 2), (1.5, 2), (True, 2), (1, 2, 3)]:
        unusable = dataclasses.replace(plan, kill_after_steps=bad)  # type: ignore[arg-type]
        with pytest.raises(ChaosUsageError, match=r"kill_after_steps .* 0 <= lo <= hi"):
            chaos_config(unusable)
    no_window = dataclasses.replace(plan, kill_window_s=0.0, kill_after_steps=None)
    with pytest.raises(ChaosUsageError, match=r"kill_window_s \(0.0\) must be > 0"):
        chaos_config(no_window)


def test_the_default_plan_is_still_the_timer(tmp_path: Path) -> None:
    plan = ChaosPlan(run_dir=tmp_path / "run", kills=3, seed=2)
    schedule = kill_schedule(plan)
    assert len(schedule) == 3
    assert all(isinstance(k, TimerKill) and 0.0 <= k.delay_s < 1.0 for k in schedule)


def test_the_step_schedule_is_seeded_and_within_its_range(tmp_path: Path) -> None:
    counts = kill_step_counts(7, 40, (0, 3))
    assert counts == kill_step_counts(7, 40, (0, 3))
    assert counts != kill_step_counts(8, 40, (0, 3))
    # Both ends of the range are drawn: 0 (kill at once) and hi.
    assert set(counts) == {0, 1, 2, 3}
    assert kill_step_counts(7, 5, (2, 2)) == [2] * 5
    schedule = kill_schedule(_steps_plan(tmp_path, (1, 3)))
    assert schedule == [StepsKill(n) for n in kill_step_counts(9, 4, (1, 3))]


# -- the watch ---------------------------------------------------------------------------


def _line(step: int, incarnation: int) -> bytes:
    record = TrainLogRecord(
        step=step,
        trainer_version=step,
        group_id=f"g{step}",
        sample_id="0",
        epoch=0,
        rewards=[0.0],
        gate_rollout_ids=["r"],
        target_step=step,
        incarnation=incarnation,
        seq=1,
    )
    return msgspec.json.encode(record) + b"\n"


def test_the_watch_counts_one_starts_distinct_steps_and_waits_for_a_whole_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / TRAIN_LOG_FILENAME
    watch = TrainStepWatch(log, incarnation=2)
    assert watch.steps() == 0  # no log yet
    # An earlier start's steps do not count; two groups of one step count once.
    log.write_bytes(_line(0, 1) + _line(1, 1) + _line(0, 2) + _line(0, 2))
    assert watch.steps() == 1
    partial = _line(1, 2)
    with open(log, "ab") as handle:
        handle.write(partial[:10])  # being written: not a step yet
    assert watch.steps() == 1
    with open(log, "ab") as handle:
        handle.write(partial[10:])
    assert watch.steps() == 2
    with open(log, "ab") as handle:
        handle.write(b"{not json\n")
    with pytest.raises(ValueError, match=f"{log}: damaged line"):
        watch.steps()


# -- the command line --------------------------------------------------------------------


def test_parse_step_range() -> None:
    assert parse_step_range("0:3") == (0, 3)
    assert parse_step_range("2:2") == (2, 2)
    for bad in ["3", "1:2:3", "a:2", "-1:2", "1.5:2", ":2", ""]:
        with pytest.raises(argparse.ArgumentTypeError, match="expected LO:HI"):
            parse_step_range(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=r"LO \(3\) must not exceed HI \(1\)"):
        parse_step_range("3:1")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kill-after-steps", "3:1"], "argument --kill-after-steps: LO (3) must not exceed HI"),
        (["--kill-after-steps", "x"], "argument --kill-after-steps: expected LO:HI"),
        (
            ["--kill-window", "2", "--kill-after-steps", "1:2"],
            "argument --kill-after-steps: not allowed with argument --kill-window",
        ),
    ],
)
def test_the_flag_refuses_bad_ranges_naming_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["chaos", "--kills", "1", *flags, "--workdir", str(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing started


# -- a real run --------------------------------------------------------------------------


@pytest.mark.slow
def test_each_kill_lands_after_its_start_trained_the_drawn_steps(tmp_path: Path) -> None:
    # The default run trains 24 steps; three kills draw 2..4 steps each (seed 11).
    plan = dataclasses.replace(_steps_plan(tmp_path, (2, 4)), kills=3, seed=11)
    drawn = kill_step_counts(plan.seed, plan.kills, (2, 4))
    report = run_chaos(plan)
    assert report.problems == [], format_report(report)
    assert [s.outcome for s in report.starts] == [StartOutcome.KILLED] * 3 + [StartOutcome.FINISHED]
    assert [s.kill_after_steps for s in report.starts] == [*drawn, None]
    assert all(s.kill_delay_s is None for s in report.starts)
    # The run's own log, after the fact: the steps each killed start trained.
    steps: defaultdict[int, set[int]] = defaultdict(set)
    for record in read_jsonl(
        Path(report.config.logging.log_dir) / TRAIN_LOG_FILENAME, TrainLogRecord
    ):
        steps[record.incarnation].add(record.step)
    trained = [len(steps[evidence.incarnation]) for evidence in report.kill_evidence]
    assert [e.start for e in report.kill_evidence] == [1, 2, 3]
    assert all(t >= d for t, d in zip(trained, drawn, strict=True)), (trained, drawn)
    assert "(kill planned after" in format_report(report)


@pytest.mark.slow
def test_the_start_timeout_bounds_the_wait_for_steps(tmp_path: Path) -> None:
    # More steps than the run has, and a timeout shorter than the run: the wait ends at
    # the timeout and the start is reported as timed out, not waited on forever.
    plan = dataclasses.replace(
        _steps_plan(tmp_path, (10_000, 10_000)), kills=1, start_timeout_s=3.0
    )
    report = run_chaos(plan)
    (start,) = report.starts
    assert start.outcome is StartOutcome.TIMED_OUT
    assert start.seconds < 3.0 + 2.0
    assert "start 1 did not finish within 3s" in report.problems


@pytest.mark.slow
def test_the_start_timeout_bounds_a_timer_kill_too(tmp_path: Path) -> None:
    # A kill drawn later than the start timeout: the start is reported as timed out at
    # the timeout, not killed (or seen to finish) once the delay is over.
    plan = ChaosPlan(
        run_dir=tmp_path / "run", kills=1, seed=3, kill_window_s=600.0, start_timeout_s=3.0
    )
    (delay,) = kill_delays(plan.seed, plan.kills, 600.0)
    assert delay > 3.0 + 2.0, delay  # the seed draws a kill well past the timeout
    report = run_chaos(plan)
    (start,) = report.starts
    assert start.outcome is StartOutcome.TIMED_OUT
    assert start.seconds < 3.0 + 2.0
    assert "start 1 did not finish within 3s" in report.problems
