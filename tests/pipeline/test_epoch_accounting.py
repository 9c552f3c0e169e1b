"""Exactly once per epoch: spares train in their epoch, and a run stopped by its step
budget logs every prompt it left untrained as pending."""

from __future__ import annotations

from pathlib import Path

import msgspec
from pipeline_helpers import expected_prompts, run_simulated, small_config

from rollvault.checkpoint_tools.run_history import (
    EpochAccount,
    check_exactly_once,
    effective_pending,
    epoch_accounts,
    epochs_reached,
    read_run_history,
)
from rollvault.cli.run_report import summary_lines
from rollvault.controller.loop.run_logs import PENDING_LOG_FILENAME, PendingReason

NUM_PROMPTS = 24
PER_STEP = 4
STEPS_PER_EPOCH = NUM_PROMPTS // PER_STEP


def test_a_run_to_the_end_trains_each_epoch_within_its_own_steps(tmp_path: Path) -> None:
    config = small_config(tmp_path, "grpo.max_num_epochs=3", "rollout.num_spare_prompts=3")
    summary, _ = run_simulated(config)
    assert summary.trainer_version == 3 * STEPS_PER_EPOCH
    history = read_run_history(Path(config.logging.log_dir))
    # In order and without drops, epoch e fills exactly its own six steps: a spare
    # pulled in epoch 0 and trained after the last epoch would land in step 17.
    for epoch in range(3):
        steps = {r.step for records in history.steps.values() for r in records if r.epoch == epoch}
        assert steps == set(range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH))
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 3)) == []
    assert summary.pending == {} and history.pending == []


def test_a_run_stopped_by_steps_logs_what_it_left_pending(tmp_path: Path) -> None:
    # 15 steps: epochs 0 and 1 whole, three steps of epoch 2, the rest of it pending.
    config = small_config(tmp_path, "grpo.max_num_epochs=4", "grpo.max_num_steps=15")
    summary, _ = run_simulated(config)
    assert summary.trainer_version == 15
    history = read_run_history(Path(config.logging.log_dir))
    pending = effective_pending(history)
    assert epochs_reached(history) == 3
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 3)) == []
    assert epoch_accounts(history, expected_prompts(NUM_PROMPTS, 3)) == [
        EpochAccount(epoch=0, expected=24, trained=24, dropped=0, pending=0),
        EpochAccount(epoch=1, expected=24, trained=24, dropped=0, pending=0),
        EpochAccount(epoch=2, expected=24, trained=12, dropped=0, pending=12),
    ]
    # In order, nothing is stamped past the budget: what is left is epoch 2's spares
    # and the prompts it never drew.
    assert {record.reason for record in pending} == {PendingReason.SPARE, PendingReason.NOT_DRAWN}
    assert all(record.group_id is None for record in pending)
    assert all(record.trainer_version == 15 for record in pending)
    assert summary.pending == {"spare": 2, "not_drawn": 10} and summary.pending_prompts == 12
    lines = summary_lines(
        summary, elapsed_s=1.0, metrics=[], restores=[], warmup=None, this_start_steps=15
    )
    assert (
        "  prompts pending 12 (the step budget ended the run before they trained: "
        "not_drawn 10, spare 2; see pending.jsonl)" in lines
    )


def test_a_windowed_run_stopped_by_steps_logs_its_groups_in_flight(tmp_path: Path) -> None:
    # Windowed, the rollout pump reserves until the train pump stops: groups are left.
    config = small_config(
        tmp_path, "sampler.kind=windowed", "grpo.max_num_epochs=4", "grpo.max_num_steps=15"
    )
    summary, _ = run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    pending = effective_pending(history)
    reached = expected_prompts(NUM_PROMPTS, epochs_reached(history))
    assert check_exactly_once(history, reached) == []
    assert all(account.unaccounted == 0 for account in epoch_accounts(history, reached))
    reasons = {record.reason for record in pending}
    assert reasons & {PendingReason.IN_FLIGHT, PendingReason.BUFFERED}
    assert all(
        (record.group_id is None)
        == (record.reason in {PendingReason.SPARE, PendingReason.NOT_DRAWN})
        for record in pending
    )
    assert summary.pending_prompts == len(pending)
    assert sum(summary.pending.values()) == len(pending)


def test_an_extended_run_trains_what_the_stopped_one_left_pending(tmp_path: Path) -> None:
    stopped = small_config(tmp_path, "grpo.max_num_epochs=3", "grpo.max_num_steps=9")
    run_simulated(stopped)
    assert read_run_history(Path(stopped.logging.log_dir)).pending
    extended = small_config(tmp_path, "grpo.max_num_epochs=3")
    summary, _ = run_simulated(extended)
    assert summary.trainer_version == 3 * STEPS_PER_EPOCH and summary.pending == {}
    history = read_run_history(Path(extended.logging.log_dir))
    # The restore rolled the first start's pending lines back: training supersedes them.
    assert history.pending and effective_pending(history) == []
    assert check_exactly_once(history, expected_prompts(NUM_PROMPTS, 3)) == []


def test_the_check_fails_on_a_prompt_neither_trained_dropped_nor_pending(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path, "grpo.max_num_epochs=2", "grpo.max_num_steps=8")
    run_simulated(config)
    log = Path(config.logging.log_dir) / PENDING_LOG_FILENAME
    lines = log.read_bytes().splitlines(keepends=True)
    assert lines
    history = read_run_history(Path(config.logging.log_dir))
    first = history.pending[0]
    # Doctored: the first pending line is gone, so that prompt is accounted nowhere.
    log.write_bytes(b"".join(lines[1:]))
    doctored = read_run_history(Path(config.logging.log_dir))
    problems = check_exactly_once(doctored, expected_prompts(NUM_PROMPTS, 2))
    key = (first.epoch, first.sample_id)
    assert problems == [f"prompt {key} was not trained, dropped or pending: it was lost"]
    assert epoch_accounts(doctored, expected_prompts(NUM_PROMPTS, 2))[key[0]].unaccounted == 1
    # Doctored again: a trained prompt also claimed pending is two outcomes.
    trained = history.steps[0][0]
    twice = msgspec.structs.replace(first, epoch=trained.epoch, sample_id=trained.sample_id)
    log.write_bytes(b"".join(lines) + msgspec.json.encode(twice) + b"\n")
    problems = check_exactly_once(
        read_run_history(Path(config.logging.log_dir)), expected_prompts(NUM_PROMPTS, 2)
    )
    assert problems == [
        f"prompt {(trained.epoch, trained.sample_id)} was trained, "
        f"pending ({first.reason.value}): 2 outcomes, not 1"
    ]
