"""The invariants checked on a finished run: its logs and its final snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from rollvault.checkpoint_tools.chaos.plan import expected_prompts
from rollvault.checkpoint_tools.run_history import (
    EpochAccount,
    RunHistory,
    WorkAccounting,
    check_exactly_once,
    check_sibling_reuse,
    check_turn_lineage,
    epoch_accounts,
    read_run_history,
    work_accounting,
)
from rollvault.config.schema import RecoveryGranularity, RestoreMode, RunConfig
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.controller.snapshots.verification import (
    ProblemKind,
    SnapshotProblem,
    VerificationLevel,
    verify_loaded_snapshot,
)
from rollvault.dataplane.interface import TRAIN_PARTITION
from rollvault.durable.errors import SnapshotError
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root


@dataclass(frozen=True)
class RunCheck:
    """The invariants checked on a finished run, and its work accounting."""

    problems: list[str]
    history: RunHistory
    accounting: WorkAccounting
    final_snapshot: Path | None
    epochs: list[EpochAccount]
    """Per epoch, its expected prompts trained, dropped and pending."""


def check_finished_run(config: RunConfig) -> RunCheck:
    """Check the logs and the final snapshot of the finished run ``config`` describes.

    A prompt of any epoch that is none of trained, dropped or pending is a problem.
    """
    history = read_run_history(Path(config.logging.log_dir))
    expected = expected_prompts(config)
    problems = check_exactly_once(history, expected)
    problems += reuse_problems(history, config)
    final_problems, final_snapshot = final_state_problems(config)
    epochs = epoch_accounts(history, expected)
    return RunCheck(
        problems=problems + final_problems + nothing_trained_problems(epochs),
        history=history,
        accounting=work_accounting(history),
        final_snapshot=final_snapshot,
        epochs=epochs,
    )


def nothing_trained_problems(epochs: list[EpochAccount]) -> list[str]:
    """A run that trained none of its prompts is a failure, whatever it dropped.

    Dropping a prompt is legitimate (a poison prompt, an exhausted retry budget), so
    exactly-once holds for a run that dropped every one: without this check such a
    run, the sign of a gate or reward that fails on everything, would pass.
    """
    expected = sum(account.expected for account in epochs)
    trained = sum(account.trained for account in epochs)
    if expected == 0 or trained > 0:
        return []
    dropped = sum(account.dropped for account in epochs)
    pending = sum(account.pending for account in epochs)
    return [
        f"no prompt was trained: of {expected} expected, {dropped} were dropped "
        f"and {pending} left pending"
    ]


def reuse_problems(history: RunHistory, config: RunConfig) -> list[str]:
    """Sealed siblings were reused, or redone whole under ``prompt_group``, as configured."""
    gate = config.gate.simulated
    problems = []
    # With simulated failures a sibling may legitimately be sealed, discarded and redone.
    if gate.transient_failure_rate == 0.0 and gate.permanent_failure_rate == 0.0:
        problems += check_sibling_reuse(history)
        if config.rollout.recovery_granularity is RecoveryGranularity.SIBLING:
            problems += check_turn_lineage(history)
    if config.rollout.recovery_granularity is RecoveryGranularity.PROMPT_GROUP:
        # Only whole groups: one whose every sibling the snapshot or the seal
        # journal holds sealed is kept; an incomplete one is redone whole.
        per_group = config.grpo.num_generations_per_prompt
        problems += [
            f"start {r.incarnation} reused {r.siblings_reused} siblings under prompt_group, "
            f"not whole groups of {per_group}"
            for r in history.restores
            if r.siblings_reused % per_group
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
    """Every problem of a finished run's snapshot, one line per row for row problems.

    What :func:`~rollvault.controller.snapshots.verification.verify_loaded_snapshot`
    finds at the ``FINISHED`` level: staged rows must be exactly those the
    ledger's sealed attempts own, and train rows exactly those of the replay
    index's groups; no group may be left in the ledger, and the replay index
    may hold only the groups trained since the last trainer checkpoint (kept
    for a rollback).
    """
    problems = verify_loaded_snapshot(
        snapshot, generations_per_group=generations_per_group, level=VerificationLevel.FINISHED
    )
    lines = [line for problem in problems for line in _problem_lines(snapshot.path, problem)]
    return lines + loss_mask_problems(snapshot)


def loss_mask_problems(snapshot: LoadedSnapshot) -> list[str]:
    """The loss mask of every canonical row covers model tokens only.

    A token outside the model's output (prompt, environment observation) has
    weight version -1; none of them may carry the loss mask.
    """
    problems = []
    for key, row in snapshot.data_plane.partitions.get(TRAIN_PARTITION, {}).items():
        versions = row.get("weight_versions")
        if not isinstance(versions, np.ndarray):
            continue  # a row of an older version: no per-token versions to check
        leaked = int(((np.asarray(row["token_mask"]) > 0) & (versions < 0)).sum())
        if leaked:
            problems.append(
                f"{snapshot.path}: train row {key} has {leaked} loss-masked tokens that the "
                "model did not generate"
            )
    return problems


def _problem_lines(where: Path, problem: SnapshotProblem) -> list[str]:
    if problem.kind is ProblemKind.ORPHAN_ROWS:
        return [
            f"{where}: {problem.partition} row {key} is referenced by nothing"
            for key in problem.keys
        ]
    if problem.kind is ProblemKind.MISSING_ROWS:
        return [
            f"{where}: {problem.partition} row {key} is referenced but absent"
            for key in problem.keys
        ]
    return [f"{where}: {problem.problem}"]
