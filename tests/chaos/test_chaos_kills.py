"""The real-process proof: SIGKILL ``rollvault run`` many times, restart it, check the evidence.

Each chaos test starts real child processes through the harness
(``rollvault chaos``), which kills only the children it started and reaps them
in a ``finally``. The checks the harness applies are themselves tested here on
a finished run whose evidence is then damaged on purpose.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest

import rollvault
from rollvault.checkpoint_tools.chaos.checks import check_finished_run, snapshot_problems
from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    ChaosUsageError,
    chaos_config,
    kill_delays,
)
from rollvault.checkpoint_tools.chaos.report import (
    ChaosReport,
    StartOutcome,
    format_report,
    lost_work_ratio,
)
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.checkpoint_tools.run_history import read_run_history
from rollvault.cli.main import main
from rollvault.config.schema import RestoreMode
from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    PENDING_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    AttemptLogRecord,
    PendingLogRecord,
    PendingReason,
    TrainLogRecord,
    read_jsonl,
)
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION
from rollvault.dataplane.rows import validate_row
from rollvault.ledger.statuses import RolloutAttemptStatus

KILLS = 10
# Kills by train steps, not seconds, so that they land on a fast or a loaded machine
# alike: the run trains 24 steps (2 epochs of 48 prompts, 4 per step), and ten kills
# of at most 2 steps of their own each (restores train some of them again) leave its
# end to the last start. 0 kills a start as soon as it counted itself, mid-restore.
KILL_AFTER_STEPS = (0, 2)
GRPO_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition.yaml"


@pytest.fixture(scope="module")
def sibling_run(tmp_path_factory: pytest.TempPathFactory) -> ChaosReport:
    plan = ChaosPlan(
        run_dir=tmp_path_factory.mktemp("chaos") / "latest",
        kills=KILLS,
        seed=1,
        kill_window_s=None,
        kill_after_steps=KILL_AFTER_STEPS,
    )
    return run_chaos(plan)


# -- the harness on real processes -----------------------------------------------------


@pytest.mark.slow
def test_ten_kills_train_every_prompt_once_and_reuse_sealed_siblings(
    sibling_run: ChaosReport,
) -> None:
    report = sibling_run
    assert report.problems == []
    assert [s.outcome for s in report.starts] == [StartOutcome.KILLED] * KILLS + [
        StartOutcome.FINISHED
    ]
    assert report.check is not None and report.check.final_snapshot is not None
    restores = report.check.history.restores
    assert restores and all(r.restore_mode == "latest" for r in restores)
    assert any(r.snapshot is not None for r in restores)
    assert sum(r.siblings_reused for r in restores) > 0
    # Each kill's evidence names its groups' target steps (a drop's replacement moves
    # a prompt to another step: its journaled seals then count as dropped).
    assert any(kill.group_target_steps for kill in report.kill_evidence)
    assert report.check.accounting.trained_tokens > 0
    # Per epoch: run to the end of its data, every prompt trained or dropped, none pending.
    epochs = report.check.epochs
    assert [a.epoch for a in epochs] == list(range(report.config.grpo.max_num_epochs))
    assert all(a.trained + a.dropped == a.expected and a.pending == 0 for a in epochs)
    text = format_report(report)
    first = epochs[0]
    assert (
        f"  epoch 0: {first.expected} prompts, {first.trained} trained, {first.dropped} "
        "dropped, 0 pending\n" in text
    )


WRITER_PROCESS_KILLS = 4


@pytest.mark.slow
def test_kills_with_the_journal_writer_in_a_process_train_every_prompt_once(
    tmp_path: Path,
) -> None:
    # The writer process dies with each killed start (EOF on its pipe); the next start
    # replays what it made durable and starts a writer process of its own.
    plan = ChaosPlan(
        run_dir=tmp_path / "latest",
        kills=WRITER_PROCESS_KILLS,
        seed=2,
        kill_window_s=None,
        kill_after_steps=KILL_AFTER_STEPS,
        overrides=("rollout_checkpointing.journal.writer=process",),
    )
    report = run_chaos(plan)
    assert report.problems == []
    assert [s.outcome for s in report.starts][-1] is StartOutcome.FINISHED
    assert report.check is not None
    restores = report.check.history.restores
    assert sum(r.journal_seals_replayed for r in restores) > 0


@pytest.mark.slow
def test_prompt_group_granularity_redoes_incomplete_groups_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = "{}:{}".format(*KILL_AFTER_STEPS)
    argv = ["chaos", "--kills", str(KILLS), "--seed", "2", "--kill-after-steps", steps]
    exit_code = main(
        [*argv, "--workdir", str(tmp_path), "rollout.recovery_granularity=prompt_group"]
    )
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert f"{KILLS} kills, {KILLS + 1} starts" in out
    assert "(kill planned after 2 train steps of its own)" in out
    assert "OK: every prompt trained exactly once" in out
    restores = read_run_history(tmp_path / "latest" / "logs").restores
    # Only whole groups are kept: those the seal journal (or the snapshot) holds complete.
    # Whether any kill finds a group incomplete is timing: in 3 of 20 runs of this test
    # alone none did (every restore redispatched 0 attempts), so this run cannot promise
    # one. That an incomplete group is redone whole, every sibling, is pinned without
    # timing by tests/pipeline/test_restore.py's
    # test_sealed_siblings_are_reused_or_redone_by_granularity (a hung sibling).
    assert restores and all(r.siblings_reused % 4 == 0 for r in restores)


@pytest.mark.slow
def test_trainer_checkpoint_baseline_regenerates_and_still_trains_once(tmp_path: Path) -> None:
    # A trainer checkpoint every step, and every kill after at least one step of its
    # start, so that most kills land after a checkpoint (seed 3 draws 14 steps in all).
    plan = ChaosPlan(
        run_dir=tmp_path / "baseline",
        kills=KILLS,
        seed=3,
        restore_mode=RestoreMode.TRAINER_CHECKPOINT,
        overrides=("checkpointing.save_period=1",),
        kill_window_s=None,
        kill_after_steps=(1, 2),
    )
    report = run_chaos(plan)
    assert report.problems == []
    assert report.kills_delivered == KILLS
    assert report.check is not None
    restores = report.check.history.restores
    assert all(r.restore_mode == "trainer_checkpoint" for r in restores)
    assert all(r.siblings_reused == 0 for r in restores)
    assert any(r.base_train_step > 0 for r in restores), "no kill came after a trainer checkpoint"
    assert sum(r.groups_regenerated for r in restores) > 0


GRPO_KILLS = 3


@pytest.mark.slow
def test_kills_of_the_real_grpo_recipe_train_every_prompt_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The packaged recipe: tiny causal LM, local model gate with its worker process,
    # GRPO trainer. A short warm-up keeps each start quick. The run trains 24 steps
    # (the harness's 2 epochs of 48 prompts, 4 per step); seed 4 draws 3, 4 and 2
    # steps, so every kill falls while the worker samples, after the start committed
    # a snapshot, however fast the machine (a kill after 1 step can come before the
    # first snapshot; kills at a start's first moment are the ten-kill run's 0 draws).
    argv = [
        "chaos",
        "--config",
        str(GRPO_RECIPE),
        "--kills",
        str(GRPO_KILLS),
        "--seed",
        "4",
        "--kill-after-steps",
        "2:6",
        "--workdir",
        str(tmp_path),
    ]
    exit_code = main([*argv, "trainer.warmup.steps=20"])
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert f"{GRPO_KILLS} kills, {GRPO_KILLS + 1} starts" in out
    assert "OK: every prompt trained exactly once" in out
    run_dir = tmp_path / "latest"
    assert (run_dir / "runs/grpo_addition/model/config.json").is_file()
    history = read_run_history(run_dir / "logs")
    # A kill can land while a start is still restoring (loading the trainer
    # state, rehydrating prompts): that start writes no restore line.
    assert 1 <= len(history.restores) <= GRPO_KILLS
    assert all(r.restore_mode == "latest" for r in history.restores)
    assert any(r.snapshot is not None for r in history.restores), "no kill found a snapshot"
    # The GRPO trainer (not the recording one) trained: its loss is in the metrics.
    metrics = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    assert metrics and all(
        "policy_loss" in msgspec.json.decode(line)["trainer"] for line in metrics
    )


# -- the checks catch damaged evidence ---------------------------------------------------


def _copy_of(report: ChaosReport, tmp_path: Path) -> ChaosPlan:
    copy = tmp_path / "copy"
    shutil.copytree(report.plan.run_dir, copy)
    return dataclasses.replace(report.plan, run_dir=copy)


def _append(path: Path, record: msgspec.Struct) -> None:
    with open(path, "ab") as handle:
        handle.write(msgspec.json.encode(record) + b"\n")


@pytest.mark.slow
def test_the_check_catches_a_group_trained_twice(sibling_run: ChaosReport, tmp_path: Path) -> None:
    plan = _copy_of(sibling_run, tmp_path)
    config = chaos_config(plan)
    log = Path(config.logging.log_dir) / TRAIN_LOG_FILENAME
    last = read_jsonl(log, TrainLogRecord)[-1]
    _append(log, last)
    problems = check_finished_run(config).problems
    key = (last.epoch, last.sample_id)
    assert f"prompt {key} was trained, trained: 2 outcomes, not 1" in problems
    assert f"group {last.group_id} trained 2 times" in problems


@pytest.mark.slow
def test_the_check_catches_a_prompt_never_trained(sibling_run: ChaosReport, tmp_path: Path) -> None:
    plan = _copy_of(sibling_run, tmp_path)
    config = chaos_config(plan)
    log = Path(config.logging.log_dir) / TRAIN_LOG_FILENAME
    lines = log.read_bytes().splitlines(keepends=True)
    last = msgspec.json.decode(lines[-1], type=TrainLogRecord)
    log.write_bytes(b"".join(lines[:-1]))
    problems = check_finished_run(config).problems
    key = (last.epoch, last.sample_id)
    assert f"prompt {key} was not trained, dropped or pending: it was lost" in problems


@pytest.mark.slow
def test_the_check_counts_pending_prompts_and_catches_lost_ones(
    sibling_run: ChaosReport, tmp_path: Path
) -> None:
    plan = _copy_of(sibling_run, tmp_path)
    config = chaos_config(plan)
    log_dir = Path(config.logging.log_dir)
    lines = (log_dir / TRAIN_LOG_FILENAME).read_bytes().splitlines(keepends=True)
    last = msgspec.json.decode(lines[-1], type=TrainLogRecord)
    key = (last.epoch, last.sample_id)
    # Doctored: the last trained prompt is neither trained, dropped nor pending.
    (log_dir / TRAIN_LOG_FILENAME).write_bytes(b"".join(lines[:-1]))
    lost = check_finished_run(config)
    assert f"prompt {key} was not trained, dropped or pending: it was lost" in lost.problems
    (account,) = [a for a in lost.epochs if a.epoch == last.epoch]
    assert account.unaccounted == 1
    lost_report = dataclasses.replace(sibling_run, plan=plan, check=lost)
    assert f"{account.pending} pending, 1 LOST" in format_report(lost_report)
    # The last start says it left that prompt pending: accounted for, no longer lost.
    pending = PendingLogRecord(
        epoch=last.epoch,
        sample_id=last.sample_id,
        reason=PendingReason.SPARE,
        group_id=None,
        trainer_version=last.step,
        incarnation=last.incarnation,
        seq=10**9,
    )
    _append(log_dir / PENDING_LOG_FILENAME, pending)
    counted = check_finished_run(config)
    assert not any(str(key) in problem for problem in counted.problems)
    (account,) = [a for a in counted.epochs if a.epoch == last.epoch]
    assert (account.pending, account.unaccounted) == (1, 0)
    # Trained and pending both: two outcomes for one prompt.
    (log_dir / TRAIN_LOG_FILENAME).write_bytes(b"".join(lines))
    both = check_finished_run(config).problems
    assert f"prompt {key} was trained, pending (spare): 2 outcomes, not 1" in both


@pytest.mark.slow
def test_the_check_catches_a_sibling_generated_again(
    sibling_run: ChaosReport, tmp_path: Path
) -> None:
    plan = _copy_of(sibling_run, tmp_path)
    config = chaos_config(plan)
    log_dir = Path(config.logging.log_dir)
    trained = read_jsonl(log_dir / TRAIN_LOG_FILENAME, TrainLogRecord)[-1]
    sealed = [
        a
        for a in read_jsonl(log_dir / ATTEMPTS_LOG_FILENAME, AttemptLogRecord)
        if a.gate_rollout_id == trained.gate_rollout_ids[0]
    ]
    assert [a.status for a in sealed] == [RolloutAttemptStatus.SEALED]
    again = msgspec.structs.replace(
        sealed[0], gate_rollout_id=sealed[0].gate_rollout_id + "x", seq=10**9
    )
    _append(log_dir / ATTEMPTS_LOG_FILENAME, again)
    problems = check_finished_run(config).problems
    assert f"group {trained.group_id} sibling 0 has 2 effective seals" in problems


@pytest.mark.slow
def test_the_check_notices_that_the_newest_snapshot_is_unusable(
    sibling_run: ChaosReport, tmp_path: Path
) -> None:
    config = chaos_config(_copy_of(sibling_run, tmp_path))
    intact = check_finished_run(config)
    assert intact.problems == [] and intact.final_snapshot is not None
    victim = intact.final_snapshot / "rollout_recovery.json"
    flipped = bytearray(victim.read_bytes())
    flipped[len(flipped) // 2] ^= 0x01
    victim.write_bytes(bytes(flipped))
    problems = check_finished_run(config).problems
    assert any(
        problem.startswith(f"the newest snapshot {intact.final_snapshot} was rejected")
        for problem in problems
    ), problems


@pytest.mark.slow
def test_the_check_catches_orphan_rows_missing_rows_and_untrained_groups(
    sibling_run: ChaosReport,
) -> None:
    source = prepare_checkpoint_dir(sibling_run.config)
    assert source is not None and source.snapshot is not None
    snapshot = source.snapshot
    per_group = sibling_run.config.grpo.num_generations_per_prompt
    assert snapshot_problems(snapshot, per_group) == []
    row = validate_row(STAGING_PARTITION, "ghost_a0/0", {"input_ids": np.arange(3)})
    partitions = {
        name: {**snapshot.data_plane.partitions.get(name, {}), f"ghost_{name}": row}
        for name in (STAGING_PARTITION, TRAIN_PARTITION)
    }
    phantom = ReplayEntry("phantom", "0", 0, 0, 0, 0)
    replay = msgspec.structs.replace(
        snapshot.replay,
        replay=msgspec.structs.replace(
            snapshot.replay.replay, entries=(*snapshot.replay.replay.entries, phantom)
        ),
    )
    damaged: LoadedSnapshot = dataclasses.replace(
        snapshot,
        data_plane=dataclasses.replace(snapshot.data_plane, partitions=partitions),
        replay=replay,
    )
    problems = set(snapshot_problems(damaged, per_group))
    where = snapshot.path
    assert {
        f"{where}: {STAGING_PARTITION} row ghost_{STAGING_PARTITION} is referenced by nothing",
        f"{where}: {TRAIN_PARTITION} row ghost_{TRAIN_PARTITION} is referenced by nothing",
        f"{where}: {TRAIN_PARTITION} row phantom_g0 is referenced but absent",
        f"{where}: 1 finalized groups were never trained",
    } <= problems


# -- the plan --------------------------------------------------------------------------


def test_the_kill_schedule_is_seeded() -> None:
    delays = kill_delays(7, 12, 0.5)
    assert delays == kill_delays(7, 12, 0.5)
    assert delays != kill_delays(8, 12, 0.5)
    assert len(delays) == 12 and all(0.0 <= d < 0.5 for d in delays)


def test_the_harness_refuses_overrides_it_owns_and_endless_runs(tmp_path: Path) -> None:
    plan = ChaosPlan(run_dir=tmp_path / "run", kills=1)
    owned = dataclasses.replace(plan, overrides=("logging.log_dir=/elsewhere",))
    with pytest.raises(ChaosUsageError, match="logging.log_dir"):
        chaos_config(owned)
    endless = dataclasses.replace(plan, overrides=("grpo.max_num_steps=5",))
    with pytest.raises(ChaosUsageError, match=r"grpo.max_num_steps \(5\).*\(96\)"):
        chaos_config(endless)
    assert chaos_config(plan).logging.log_dir == str((tmp_path / "run" / "logs").resolve())


def test_the_lost_work_ratio() -> None:
    assert lost_work_ratio(100, 2000) == 20.0
    assert lost_work_ratio(0, 2000) == float("inf")
    assert lost_work_ratio(0, 0) == 1.0
