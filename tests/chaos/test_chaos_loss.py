"""The per-kill loss account, on a hand-made history and kill evidence (no run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec

from rollvault.checkpoint_tools.chaos.kill_evidence import (
    InFlightAttempt,
    KillEvidence,
    load_kill_evidence,
    read_kill_evidence,
    write_kill_evidence,
)
from rollvault.checkpoint_tools.chaos.loss import (
    KillLoss,
    LossAccount,
    durable_loss_problems,
    loss_account,
)
from rollvault.checkpoint_tools.run_history import RunHistory
from rollvault.config.loading import load_run_config
from rollvault.controller.loop.dispatch_journal import DISPATCH_JOURNAL_DIRNAME, DispatchJournal
from rollvault.controller.loop.run_logs import AttemptLogRecord, DropLogRecord, TrainLogRecord
from rollvault.ledger.statuses import RolloutAttemptStatus

SEALED = RolloutAttemptStatus.SEALED


def _sealed(
    group: str,
    index: int,
    tokens: int,
    *,
    incarnation: int,
    seq: int,
    name: str | None = None,
    adopted_from: str | None = None,
) -> AttemptLogRecord:
    return AttemptLogRecord(
        gate_rollout_id=name or f"{group}_g{index}_a{incarnation}{seq}",
        group_id=group,
        generation_index=index,
        status=SEALED,
        num_tokens=tokens,
        incarnation=incarnation,
        seq=seq,
        adopted_from=adopted_from,
    )


def _trained(group: str, sample: str, rollout_ids: list[str]) -> TrainLogRecord:
    return TrainLogRecord(
        step=0,
        trainer_version=0,
        group_id=group,
        sample_id=sample,
        epoch=0,
        rewards=[0.0] * len(rollout_ids),
        gate_rollout_ids=rollout_ids,
        target_step=0,
        incarnation=2,
    )


def _kill(*, journaled: set[str], in_flight: list[InFlightAttempt]) -> KillEvidence:
    return KillEvidence(
        start=1,
        incarnation=1,
        snapshot_log_seq=10,
        journaled_seals=frozenset(journaled),
        journal_next_seq=7,
        in_flight=tuple(in_flight),
    )


def test_each_lost_seal_is_charged_to_its_kill_by_what_the_kill_left_durable() -> None:
    in_snapshot = _sealed("g1", 0, 5, incarnation=1, seq=4, name="in_snapshot")
    journaled = _sealed("g1", 1, 6, incarnation=1, seq=12, name="journaled")
    too_late = _sealed("g1", 2, 7, incarnation=1, seq=13, name="too_late")
    of_dropped = _sealed("g2", 0, 8, incarnation=1, seq=14, name="of_dropped")
    trained = _sealed("g3", 0, 9, incarnation=1, seq=15, name="trained")
    after = _sealed("g4", 0, 3, incarnation=2, seq=20, name="after")
    redo = _sealed("g3", 1, 11, incarnation=2, seq=21, name="redo")
    # The next start's replay logs the journaled seal again: it generated nothing more.
    replayed = _sealed("g1", 1, 6, incarnation=2, seq=2, name="journaled")
    history = RunHistory(
        train=[_trained("g3", "3", ["trained", "redo"])],
        drops=[
            DropLogRecord(
                group_id="g2", sample_id="2", epoch=0, target_step=0, replaced=False, incarnation=1
            )
        ],
        attempts=[in_snapshot, journaled, too_late, of_dropped, trained, after, redo, replayed],
        restores=[],
    )
    history.steps = {0: history.train}
    kill = _kill(
        journaled={"journaled", "of_dropped"},
        in_flight=[InFlightAttempt("g3", 1, "ab" * 16, None)],
    )

    account = loss_account(history, [kill])

    [loss] = account.kills
    assert (loss.not_durable_tokens, loss.not_durable_seals) == (7, 1)
    assert (loss.dropped_tokens, loss.dropped_seals) == (8, 1)
    assert loss.durable_lost == ["in_snapshot", "journaled"]
    assert loss.durable_lost_tokens == 11
    assert account.after_last_kill_tokens == 3
    assert (loss.in_flight_attempts, loss.in_flight_tokens, loss.in_flight_unmatched) == (1, 11, 0)
    assert account.sealed_lost_tokens == 7 + 8 + 11 + 3
    assert account.physical_limit_tokens == 11 + 7
    assert account.limit_ratio() == (29 + 11) / 18
    assert account.limit_ratio(0.5) == (29 + 5.5) / (5.5 + 7)


def test_an_adopted_seal_is_kept_and_a_lost_groups_attempt_is_measured_by_its_prompts_redo() -> (
    None
):
    journaled = _sealed("lost", 0, 6, incarnation=1, seq=12, name="journaled")
    adopted = _sealed("new", 0, 0, incarnation=2, seq=3, name="adopted", adopted_from="journaled")
    redo = _sealed("new", 1, 13, incarnation=2, seq=4, name="redo")
    history = RunHistory(
        train=[_trained("new", "5", ["adopted", "redo"])],
        drops=[],
        attempts=[journaled, adopted, redo],
        restores=[],
    )
    history.steps = {0: history.train}
    in_flight = [
        InFlightAttempt("lost", 1, "cd" * 16, (0, 5)),  # its group died with the process
        InFlightAttempt("gone", 0, "ef" * 16, (0, 9)),  # never redone: the mean sealed length
    ]

    first = _kill(journaled={"journaled"}, in_flight=in_flight)
    # Killed again before a snapshot: the first kill's attempts are on disk unreturned still.
    again = dataclasses.replace(first, start=2, incarnation=3, in_flight=tuple(in_flight[:1]))

    account = loss_account(history, [first, again])

    loss, second = account.kills
    assert (second.in_flight_attempts, second.in_flight_tokens) == (0, 0)
    assert account.sealed_lost_tokens == 0
    assert loss.durable_lost == []
    assert (loss.in_flight_attempts, loss.in_flight_unmatched) == (2, 1)
    assert loss.in_flight_tokens == 13 + round((6 + 13) / 2)
    assert account.limit_ratio() == 1.0


def test_a_kills_evidence_names_the_dispatched_attempts_that_never_came_back(
    tmp_path: Path,
) -> None:
    config = load_run_config(None, [f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"])
    journal = DispatchJournal(tmp_path / "ckpt" / DISPATCH_JOURNAL_DIRNAME)
    back, in_flight = "a1" * 16, "b2" * 16
    journal.dispatched(group_id="g7", epoch=1, dataset_idx=3, attempts=[(0, back), (1, in_flight)])
    journal.returned(back)
    journal.close()

    evidence = read_kill_evidence(config, start=2, incarnation=2)

    # No anchor yet (killed before its first snapshot): every dispatched group is a lost one.
    assert evidence.in_flight == (InFlightAttempt("g7", 1, in_flight, (1, 3)),)
    assert (evidence.snapshot_log_seq, evidence.journaled_seals) == (0, frozenset())
    assert evidence.problem is None
    assert not (tmp_path / "ckpt" / "bootstrap").exists()
    write_kill_evidence(tmp_path / "evidence.json", [evidence])
    assert load_kill_evidence(tmp_path / "evidence.json") == [evidence]


def test_a_durable_seal_generated_again_is_a_problem_only_where_the_journal_promises_it() -> None:
    account = LossAccount(kills=[KillLoss(start=3, durable_lost_tokens=9, durable_lost=["x"])])
    latest = load_run_config(None, [])
    baseline = load_run_config(None, ["rollout_checkpointing.restore_mode=trainer_checkpoint"])
    no_journal = load_run_config(None, ["rollout_checkpointing.journal.enabled=false"])

    assert durable_loss_problems(latest, account) == [
        "start 3: 1 seals durable at its kill were generated again (9 tokens), e.g. ['x']"
    ]
    assert durable_loss_problems(baseline, account) == []
    assert durable_loss_problems(no_journal, account) == []


def test_a_journaled_seal_of_a_lost_group_whose_prompt_was_dropped_counts_as_dropped() -> None:
    journaled = _sealed("lost", 0, 6, incarnation=1, seq=12, name="journaled")
    drop = DropLogRecord(
        group_id="next", sample_id="4", epoch=0, target_step=0, replaced=True, incarnation=2
    )
    history = RunHistory(train=[], drops=[drop], attempts=[journaled], restores=[])
    kill = dataclasses.replace(
        _kill(journaled={"journaled"}, in_flight=[]), group_prompts={"lost": (0, 4)}
    )

    [loss] = loss_account(history, [kill]).kills

    assert (loss.dropped_tokens, loss.durable_lost) == (6, [])


def test_a_journaled_seal_whose_prompt_a_drops_replacement_moved_to_another_step_is_dropped() -> (
    None
):
    # Chaos seed 113, 20 kills, under load: no start after the second committed a
    # snapshot, so prompt 28's sibling was in flight at 9 deaths and the last start
    # gave it up (the interruption budget) and replaced it with the next prompt, 47,
    # at its target step 1. The second start had reserved prompt 47 at step 2 and
    # journaled 3 of its seals; a journaled seal is adopted only at the step it was
    # stamped for, so they were generated again: a cost of the drop, not a hole.
    journaled = _sealed("lost", 0, 6, incarnation=1, seq=12, name="journaled")
    redo = _sealed("moved", 0, 7, incarnation=2, seq=3, name="redo")
    drop = DropLogRecord(
        group_id="poison", sample_id="28", epoch=0, target_step=1, replaced=True, incarnation=2
    )
    moved = msgspec.structs.replace(_trained("moved", "47", ["redo"]), step=1, target_step=1)
    history = RunHistory(
        train=[moved], drops=[drop], attempts=[journaled, redo], restores=[], steps={1: [moved]}
    )
    kill = dataclasses.replace(
        _kill(journaled={"journaled"}, in_flight=[]),
        group_prompts={"lost": (0, 47)},
        group_target_steps={"lost": 2},
    )

    [loss] = loss_account(history, [kill]).kills
    assert (loss.dropped_tokens, loss.durable_lost) == (6, [])

    # Trained at the step it was stamped for, it could have been adopted: a hole.
    same_step = dataclasses.replace(kill, group_target_steps={"lost": 1})
    [loss] = loss_account(history, [same_step]).kills
    assert (loss.dropped_tokens, loss.durable_lost) == (0, ["journaled"])

    # Without a replaced drop, nothing moves a prompt to another step: a hole too.
    no_drop = dataclasses.replace(history, drops=[])
    [loss] = loss_account(no_drop, [kill]).kills
    assert (loss.dropped_tokens, loss.durable_lost) == (0, ["journaled"])
