"""Crash a run (in-process: the trainer raises), start it again, check the history.

The real-process proof with SIGKILL is the chaos harness
(tests/pipeline/test_chaos.py); these are the fast, deterministic cases.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from pathlib import Path

import pytest
from pipeline_helpers import (
    expected_prompts,
    run_simulated,
    run_stalled_then_kill,
    run_until_crash,
    small_config,
)

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    check_sibling_reuse,
    read_run_history,
    work_accounting,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.dispatch_journal import (
    DISPATCH_JOURNAL_DIRNAME,
    read_dispatch_journal,
)
from rollvault.controller.snapshots.crash_evidence import crash_evidence
from rollvault.controller.snapshots.restorer import RestoreError, read_recovery_sidecar
from rollvault.controller.snapshots.resume import RunExistsError, prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import SnapshotCorruptError, segments_dir_for
from rollvault.dataplane.segmented_index import checkpoint_summary
from rollvault.durable.errors import IncompatibleRunError
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_steps
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.statuses import RolloutAttemptStatus

SLOW_GATE = (
    "gate.simulated.latency_per_token_s=0.002",
    "rollout_checkpointing.interval_s=0.05",
    "checkpointing.save_period=4",
)


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, *SLOW_GATE, *overrides)


def _history_problems(config: RunConfig) -> list[str]:
    history = read_run_history(Path(config.logging.log_dir))
    return check_exactly_once(history, expected_prompts(24, 2))


@pytest.mark.parametrize("granularity", ["sibling", "prompt_group"])
def test_crashes_then_resume_train_every_prompt_once(tmp_path: Path, granularity: str) -> None:
    config = _config(tmp_path, f"rollout.recovery_granularity={granularity}")
    for crash_step in (2, 5, 9):
        run_until_crash(config, crash_step)
    summary, _ = run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    assert [r.incarnation for r in history.restores] == [2, 3, 4]
    assert all(r.snapshot is not None for r in history.restores)
    assert summary.trainer_version == 12
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
    assert check_sibling_reuse(history) == []


@pytest.mark.parametrize("granularity", ["sibling", "prompt_group"])
def test_sealed_siblings_are_reused_or_redone_by_granularity(
    tmp_path: Path, granularity: str
) -> None:
    # Sibling 3 of every group hangs: snapshots hold groups with 3 siblings sealed.
    config = _config(tmp_path, f"rollout.recovery_granularity={granularity}")
    run_stalled_then_kill(config, stalled_index=3)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    unfinished = restore.attempts_redispatched // (1 if granularity == "sibling" else 4)
    assert unfinished == 6  # max_inflight_prompts groups were stuck
    if granularity == "sibling":
        assert (restore.siblings_reused, restore.attempts_redispatched) == (18, 6)
    else:
        assert (restore.siblings_reused, restore.attempts_redispatched) == (0, 24)
    # Net of discarded seals, every trained sibling was sealed exactly once.
    assert check_sibling_reuse(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_trainer_checkpoint_baseline_regenerates_and_still_trains_once(tmp_path: Path) -> None:
    config = _config(tmp_path, "rollout_checkpointing.restore_mode=trainer_checkpoint")
    run_until_crash(config, 6)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    assert restore.base_train_step == 4
    assert restore.siblings_reused == 0 and restore.canonical_group_ids == []
    # Steps 4 and 5 trained after step_4/ and before the crash (at step 6); the
    # baseline rolls them back and trains them again from new generations. (How
    # many groups step_4/ held in flight, and so restore.groups_regenerated,
    # depends on timing: maybe none.)
    rolled_back = [r for r in history.train if history.is_void(r.incarnation, r.seq)]
    assert {r.step for r in rolled_back} == {4, 5}
    assert all(r.incarnation == 1 for r in rolled_back)
    again = [r for step in (4, 5) for r in history.steps[step]]
    assert again and all(r.incarnation == 2 for r in again)
    earlier_ids = {i for r in rolled_back for i in r.gate_rollout_ids}
    assert not earlier_ids & {i for r in again for i in r.gate_rollout_ids}
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
    accounting = work_accounting(history)
    assert accounting.lost_tokens > 0


def test_a_changed_config_is_refused_naming_every_path(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    changed = _config(tmp_path, "grpo.num_generations_per_prompt=5", "reward.format_penalty=0.5")
    with pytest.raises(IncompatibleRunError) as raised:
        prepare_checkpoint_dir(changed)
    message = str(raised.value)
    assert "grpo.num_generations_per_prompt: 4 -> 5" in message
    assert "reward.format_penalty" in message


def test_an_operational_change_resumes(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    resumed = _config(tmp_path, "rollout_checkpointing.interval_s=0.07", "logging.progress=true")
    assert prepare_checkpoint_dir(resumed) is not None


def test_the_number_of_trainer_checkpoints_kept_is_an_operational_setting(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, "checkpointing.save_period=2", "checkpointing.keep_latest_k=3")
    run_until_crash(config, 9)
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    assert trainer_checkpoint_steps(checkpoint_dir) == [4, 6, 8]
    # Keeping fewer changes nothing the run computes: the resume is not refused.
    fewer = _config(tmp_path, "checkpointing.save_period=2", "checkpointing.keep_latest_k=1")
    summary, _ = run_simulated(fewer)
    assert summary.trainer_version == 12
    assert trainer_checkpoint_steps(checkpoint_dir) == [12]
    assert not [p for p in checkpoint_dir.iterdir() if p.name.startswith(("tmp_", "trash_"))]
    assert _history_problems(fewer) == []


def test_restore_mode_none_refuses_an_existing_run_unless_forced(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    with pytest.raises(RunExistsError, match="force_fresh"):
        prepare_checkpoint_dir(_config(tmp_path, "rollout_checkpointing.restore_mode=none"))
    forced = _config(
        tmp_path,
        "rollout_checkpointing.restore_mode=none",
        "rollout_checkpointing.force_fresh=true",
    )
    assert prepare_checkpoint_dir(forced) is None
    assert not Path(config.logging.log_dir).exists()


def _newest_snapshot(config: RunConfig) -> Path:
    snapshots = sorted(
        Path(config.checkpointing.checkpoint_dir).glob("step_*/rollout_snapshots/snapshot_*")
    )
    snapshots += sorted(
        Path(config.checkpointing.checkpoint_dir).glob("bootstrap/rollout_snapshots/snapshot_*")
    )
    return max(snapshots, key=lambda path: (path.parent.parent.name, path.name))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_snapshot_file_falls_back_to_the_previous_snapshot(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(
        tmp_path, "rollout_checkpointing.keep_latest_k=3", "checkpointing.save_period=1000"
    )
    run_until_crash(config, 6)
    newest = _newest_snapshot(config)
    files = sorted(p for p in newest.rglob("*") if p.is_file())
    assert len(files) >= 7
    for victim in files:
        original = victim.read_bytes()
        if damage == "truncate":
            victim.write_bytes(original[: len(original) // 2])
        else:
            flipped = bytearray(original)
            flipped[len(flipped) // 2] ^= 0x01
            victim.write_bytes(bytes(flipped))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rollvault.durable"):
            source = prepare_checkpoint_dir(config)
        assert source is not None and source.snapshot is not None
        assert source.snapshot.path != newest, f"damaged {victim.name} was not detected"
        assert victim.name in caplog.text, f"the warning does not name {victim.name}"
        victim.write_bytes(original)
    # Undamaged again: the newest is used, and the run completes exactly once.
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None and source.snapshot.path == newest
    run_simulated(config)
    assert _history_problems(config) == []


def test_read_recovery_sidecar_checks_checksum_group_count_and_rewards(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    snapshot = source.snapshot.path
    sidecar = snapshot / "rollout_recovery.json"
    metadata = checkpoint_summary(snapshot / "data_plane", segments_dir_for(snapshot)).user_metadata
    parsed = asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config))
    assert parsed.ledger_state == source.snapshot.recovery.ledger_state

    wrong_sum = copy.deepcopy(metadata)
    wrong_sum["sidecars"]["rollout_recovery.json"]["sha256"] = "0" * 64
    with pytest.raises(SnapshotCorruptError, match="rollout_recovery.json: SHA-256"):
        asyncio.run(read_recovery_sidecar(sidecar, wrong_sum, master_config=config))

    wrong_count = copy.deepcopy(metadata)
    wrong_count["sidecars"]["rollout_recovery.json"]["group_count"] += 1
    with pytest.raises(SnapshotCorruptError, match="advertises"):
        asyncio.run(read_recovery_sidecar(sidecar, wrong_count, master_config=config))

    other_rewards = _config(tmp_path, "reward.overlong_penalty=0.5")
    with pytest.raises(RestoreError, match="rewards were captured under"):
        asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=other_rewards))


def test_attempts_the_controller_cancelled_are_not_charged_as_interrupted(
    tmp_path: Path,
) -> None:
    # A crash elsewhere (the trainer) cancels the attempts in flight: they killed nothing.
    # Without the seal journal, whose replay would seal what was in flight and leave
    # nothing to redispatch.
    crashed = _config(tmp_path / "crashed", "rollout_checkpointing.journal.enabled=false")
    run_until_crash(crashed, 3)
    run_simulated(crashed)
    (restore,) = read_run_history(Path(crashed.logging.log_dir)).restores
    assert restore.snapshot is not None and restore.attempts_redispatched > 0
    assert restore.attempts_interrupted == 0
    # A clean stop at the step budget cancels them before the final snapshot, which
    # still holds them dispatched; the journal it leaves says they came back. The
    # gate finishes the first 12 groups (steps 0-2, none too stale to train) and
    # hangs every later one; step 2 trains only once one hangs, so work is surely
    # in flight at the stop.
    stopped = _config(
        tmp_path / "stopped",
        "grpo.max_num_steps=3",
        "sampler.kind=windowed",
        "sampler.max_staleness_versions=3",
    )
    summary, _ = run_simulated(stopped, hang_after_groups=12)
    assert summary.trainer_version == 3 and summary.groups_in_flight > 0
    source = prepare_checkpoint_dir(stopped)
    assert source is not None and source.snapshot is not None
    records = RolloutRecoveryLedger.from_state_dict(source.snapshot.recovery.ledger_state).groups()
    assert any(
        sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED
        for record in records
        for sibling in record.siblings
    )
    tail = read_dispatch_journal(
        Path(stopped.checkpointing.checkpoint_dir) / DISPATCH_JOURNAL_DIRNAME,
        after_seq=source.snapshot.controller.dispatch_journal_seq,
    )
    assert crash_evidence(records, tail, reason="x").count == 0
