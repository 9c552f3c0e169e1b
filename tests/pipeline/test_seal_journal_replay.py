"""Crash a run in-process (the trainer raises, no final snapshot), restore, replay the journal.

The SIGKILL proofs at the journal's fault points are in test_seal_journal_crash.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pipeline_helpers import (
    dataset_of,
    expected_prompts,
    run_simulated,
    run_stalled_then_kill,
    run_until_crash,
    run_until_crash_past_snapshot,
    small_config,
)

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    check_sibling_reuse,
    check_turn_lineage,
    read_run_history,
    work_accounting,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.loop.seal_journal import SEAL_JOURNAL_DIRNAME, SealRecord, decode_replay
from rollvault.controller.snapshots.checkpointer import Checkpointer
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir, run_fingerprint
from rollvault.durable.journal_format import list_segments, read_journal
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.registry import get_task
from rollvault.training.recording import RecordingTrainer

pytestmark = pytest.mark.slow

# Snapshots 0.1 s apart on a gate that seals a group in tens of ms: a crash
# finds seals (and whole groups) after the newest snapshot.
SETTINGS = (
    "gate.simulated.latency_per_token_s=0.002",
    "rollout_checkpointing.interval_s=0.1",
    "checkpointing.save_period=1000",
)


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, *SETTINGS, *overrides)


def test_seals_after_the_snapshot_are_kept_not_generated_again(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run_until_crash_past_snapshot(config, 6)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    assert restore.snapshot is not None and restore.journal_records > 0
    adopted = [a for a in history.attempts if a.adopted_from is not None]
    assert restore.journal_seals_replayed + len(adopted) > 0
    # Every attempt that sealed, in either start, trained: nothing sealed was thrown away.
    accounting = work_accounting(history)
    assert accounting.generated_tokens > 0
    assert accounting.lost_tokens == 0
    assert check_sibling_reuse(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
    # The second start generated nothing the first one had sealed.
    first = {
        (a.group_id, a.generation_index)
        for a in history.attempts
        if a.incarnation == 1 and a.status is RolloutAttemptStatus.SEALED
    }
    regenerated = [
        a
        for a in history.attempts
        if a.incarnation == 2
        and a.status is RolloutAttemptStatus.SEALED
        and a.reason is None
        and (a.group_id, a.generation_index) in first
    ]
    assert regenerated == []


def test_prompt_group_granularity_replays_and_trains_every_prompt_once(tmp_path: Path) -> None:
    # An incomplete prompt_group group is redone whole after the replay (by design);
    # a complete one, replayed or adopted, trains as it was sealed.
    config = _config(tmp_path, "rollout.recovery_granularity=prompt_group")
    run_until_crash_past_snapshot(config, 6)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    assert restore.journal_records > 0
    assert check_sibling_reuse(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_without_the_journal_seals_after_the_snapshot_are_lost(tmp_path: Path) -> None:
    # The same crash with the journal off: the loss the journal removes is real. The crash
    # waits for a seal after the newest snapshot (a crash right after a commit, with
    # nothing sealed since, loses nothing, journal or not).
    config = _config(tmp_path, "rollout_checkpointing.journal.enabled=false")
    run_until_crash_past_snapshot(config, 6)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    assert work_accounting(history).lost_tokens > 0
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_a_torn_journal_tail_is_cut_off_reported_and_the_run_trains_once(tmp_path: Path) -> None:
    # Before the first snapshot: every journaled seal waits for its prompt's new group.
    config = _config(tmp_path, "rollout_checkpointing.interval_s=3600")
    run_until_crash(config, 4, after_snapshot=False)
    directory = Path(config.checkpointing.checkpoint_dir) / SEAL_JOURNAL_DIRNAME
    # Tear the newest seal record: cut the newest segment inside its last seal.
    records = decode_replay(read_journal(directory))
    last_seal = max((r for r in records if isinstance(r.entry, SealRecord)), key=lambda r: r.seq)
    assert last_seal.segment == list_segments(directory)[-1][1]
    with open(last_seal.segment, "r+b") as handle:
        handle.truncate(last_seal.offset + 20)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    assert restore.snapshot is None and restore.journal_damage is not None
    assert f"at byte {last_seal.offset}: torn" in restore.journal_damage
    assert check_sibling_reuse(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
    # Only what the torn record held (and what followed it) was generated again. The
    # record may be a generation batch's: its seals share its seq, and all of them tore.
    torn = [r.entry for r in records if r.seq == last_seal.seq]
    assert all(isinstance(entry, SealRecord) for entry in torn)
    lost = work_accounting(history).lost_tokens
    later = [r for r in records if r.seq > last_seal.seq and isinstance(r.entry, SealRecord)]
    assert later == []
    assert 0 < lost <= sum(entry.num_tokens for entry in torn if isinstance(entry, SealRecord))


def test_seals_still_pooled_when_a_snapshot_commits_are_kept_by_that_snapshot(
    tmp_path: Path,
) -> None:
    # No snapshot before the crash: the restore pools every journaled seal. A
    # snapshot that commits before their prompts come back drops the journal
    # segments that held them, so the snapshot itself must keep them.
    config = _config(tmp_path, "rollout_checkpointing.interval_s=3600")
    run_until_crash(config, 4, after_snapshot=False)
    directory = Path(config.checkpointing.checkpoint_dir) / SEAL_JOURNAL_DIRNAME

    async def restore() -> RolloutParts:
        source = prepare_checkpoint_dir(config)
        assert source is not None
        parts = build_parts(config, dataset=dataset_of(config))
        await RolloutRestorer(
            parts,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=source,
        ).restore()
        return parts

    def close(parts: RolloutParts) -> None:
        parts.logs.close()
        if parts.seal_journal is not None:
            parts.seal_journal.close()

    async def main() -> tuple[dict[tuple[int, int], dict[int, SealRecord]], RolloutParts]:
        parts = await restore()
        try:
            pooled = {prompt: dict(seals) for prompt, seals in parts.journaled_seals.items()}
            checkpointer = Checkpointer(
                parts, RecordingTrainer(), fingerprint=run_fingerprint(config)
            )
            assert await checkpointer.snapshot_if_changed() is not None
        finally:
            close(parts)
        again = await restore()
        close(again)
        return pooled, again

    pooled, again = asyncio.run(main())
    assert sum(len(seals) for seals in pooled.values()) > 0
    # The pooled seals' records are gone from the journal: only the snapshot has them.
    pooled_ids = {s.gate_rollout_id for seals in pooled.values() for s in seals.values()}
    left = {
        r.entry.gate_rollout_id
        for r in decode_replay(read_journal(directory))
        if isinstance(r.entry, SealRecord)
    }
    assert pooled_ids.isdisjoint(left)
    assert again.journaled_seals == pooled


def test_seals_of_a_restart_killed_before_its_first_snapshot_are_kept_by_the_next(
    tmp_path: Path,
) -> None:
    # Start 1 is stopped with sibling 3 of every group in flight, stuck, in its
    # snapshot S. Start 2 restores S, mints fresh attempts for those siblings, seals
    # them (journaled) and dies before a snapshot of its own. Start 3 restores S
    # again: S names the old, dead attempts, the journal start 2's seals of the
    # fresh ones; they must not be generated again.
    config = _config(tmp_path)
    run_stalled_then_kill(config, stalled_index=3)
    quiet = _config(tmp_path, "rollout_checkpointing.interval_s=3600")
    run_until_crash(quiet, 0, after_snapshot=False)
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    second, third = history.restores
    assert second.snapshot is not None and third.snapshot == second.snapshot
    assert second.attempts_redispatched > 0
    minted_by_second = {
        a.gate_rollout_id
        for a in history.attempts
        if a.incarnation == 2 and a.status is RolloutAttemptStatus.SEALED and a.reason is None
    }
    kept = [
        a for a in history.attempts if a.incarnation == 3 and a.adopted_from in minted_by_second
    ]
    assert kept, "start 3 kept none of start 2's seals"
    assert third.journal_seals_unmatched == 0
    assert work_accounting(history).lost_tokens == 0
    assert check_sibling_reuse(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


@pytest.mark.parametrize("multiturn", [False, True], ids=["one_turn", "guess"])
def test_seals_of_a_restart_that_inherited_committed_turns_are_kept_by_the_next(
    tmp_path: Path, multiturn: bool
) -> None:
    # As above, but sibling 3 of every group committed a turn before it stuck (a
    # snapshot taken between a turn's commit and its attempt's seal): S names the old
    # attempts dispatched with a committed turn. Start 2's fresh attempts inherit it,
    # continue the episode (a one-turn episode has nothing left), seal (journaled) and
    # start 2 dies before a snapshot of its own; start 3 restores S again and must
    # adopt those seals, not generate them again.
    overrides = ("dataset.kind=guess",) if multiturn else ()
    environment = get_task("guess").episode_environment if multiturn else None
    config = _config(tmp_path, *overrides)
    run_stalled_then_kill(config, stalled_index=3, after_turns=True, environment=environment)
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    ledger = RolloutRecoveryLedger.from_state_dict(source.snapshot.recovery.ledger_state)
    stuck = [record.siblings[3].current_attempt for record in ledger.groups()]
    assert stuck and all(
        a.status is RolloutAttemptStatus.DISPATCHED and a.turn_keys for a in stuck
    ), "the snapshot does not hold the stuck attempts with their turn committed"
    quiet = _config(tmp_path, *overrides, "rollout_checkpointing.interval_s=3600")
    run_until_crash(quiet, 0, after_snapshot=False, environment=environment)
    run_simulated(config, environment=environment)
    history = read_run_history(Path(config.logging.log_dir))
    second, third = history.restores
    assert second.snapshot is not None and third.snapshot == second.snapshot
    assert second.turns_resumed > 0 and not second.episodes_restarted
    minted_by_second = {
        a.gate_rollout_id: a
        for a in history.attempts
        if a.incarnation == 2 and a.status is RolloutAttemptStatus.SEALED and a.reason is None
    }
    assert minted_by_second
    if multiturn:  # they generated the turns after the inherited one
        assert any(a.num_tokens > 0 for a in minted_by_second.values())
    kept = [
        a for a in history.attempts if a.incarnation == 3 and a.adopted_from in minted_by_second
    ]
    assert kept, "start 3 kept none of start 2's seals"
    assert third.journal_seals_unmatched == 0
    assert work_accounting(history).lost_tokens == 0
    assert check_sibling_reuse(history) == []
    assert check_turn_lineage(history) == []
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
