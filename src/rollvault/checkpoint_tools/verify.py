"""Verifying a checkpoint directory fully: what ``rollvault verify CKPT_DIR`` checks.

For each committed rollout snapshot and each trainer checkpoint's
``rollout_state``: everything
:func:`~rollvault.controller.snapshots.verification.verify_snapshot` checks
at the ``FULL`` level (the manifest against its anchor's step and the run's
fingerprint, every sidecar's SHA-256, everything restore checks, and no row
that nothing references). Also the bootstrap anchor (strict schema,
fingerprint consistent with the identity beside it) and each trainer
checkpoint's ``trainer/`` directory.

:func:`verify_checkpoint_dir` returns every problem, each naming its file.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from rollvault.checkpoint_tools.inventory import (
    AnchorEntry,
    AnchorKind,
    CheckpointInventory,
    CheckpointProblem,
    take_inventory,
)
from rollvault.controller.snapshots.checkpointer import TRAINER_STATE_DIRNAME
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.controller.snapshots.verification import (
    SnapshotProblem,
    VerificationLevel,
    verify_loaded_snapshot,
    verify_snapshot,
)
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, BOOTSTRAP_POLICY_DIRNAME
from rollvault.durable.trainer_checkpoints import verify_trainer_checkpoint


class VerifyReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What ``rollvault verify --json`` prints."""

    checkpoint_dir: str
    ok: bool
    snapshots_checked: list[str]
    problems: list[CheckpointProblem]
    leftovers: list[str]
    """``tmp_``/``trash_`` directories of an interrupted write or prune: never read, not errors."""


def verify_checkpoint_dir(checkpoint_dir: Path) -> VerifyReport:
    """Verify everything under ``checkpoint_dir`` (see the module docstring)."""
    inventory = take_inventory(checkpoint_dir, now=time.time())
    bootstrap = inventory.bootstrap
    problems = [bootstrap.damage] if bootstrap.damage is not None else []
    checked: list[str] = []
    problems += _version_zero_policy_problems(checkpoint_dir)
    for anchor in inventory.anchors:
        problems += _trainer_state_problems(anchor)
        for snapshot in anchor.snapshots:
            checked.append(snapshot.path)
            verification = verify_snapshot(
                Path(snapshot.path),
                generations_per_group=bootstrap.generations_per_group,
                level=VerificationLevel.FULL,
                expected_step=anchor.step,
                expected_fingerprint=bootstrap.fingerprint,
            )
            problems += _as_checkpoint_problems(verification.problems)
    return VerifyReport(
        checkpoint_dir=str(checkpoint_dir),
        ok=not problems,
        snapshots_checked=checked,
        problems=problems,
        leftovers=_all_leftovers(inventory),
    )


def cross_reference_problems(
    snapshot: LoadedSnapshot, *, generations_per_group: int | None
) -> list[CheckpointProblem]:
    """Every problem between the files of a decoded snapshot, orphan rows included."""
    problems = verify_loaded_snapshot(
        snapshot, generations_per_group=generations_per_group, level=VerificationLevel.FULL
    )
    return _as_checkpoint_problems(problems)


def _as_checkpoint_problems(
    problems: tuple[SnapshotProblem, ...] | list[SnapshotProblem],
) -> list[CheckpointProblem]:
    return [CheckpointProblem(str(problem.path), problem.problem) for problem in problems]


def _version_zero_policy_problems(checkpoint_dir: Path) -> list[CheckpointProblem]:
    """The version-0 policy saved with the bootstrap anchor matches its digests, if present."""
    policy = checkpoint_dir / BOOTSTRAP_DIRNAME / BOOTSTRAP_POLICY_DIRNAME
    if not policy.is_dir():
        return []
    return [
        CheckpointProblem(str(path), f"version-0 policy file: {problem}")
        for path, problem in verify_trainer_checkpoint(policy)
    ]


def _trainer_state_problems(anchor: AnchorEntry) -> list[CheckpointProblem]:
    """A trainer checkpoint's state is present and every file matches its recorded digest."""
    if anchor.kind is not AnchorKind.TRAINER_CHECKPOINT:
        return []
    if anchor.trainer_state_bytes is None:
        path = Path(anchor.path) / TRAINER_STATE_DIRNAME
        return [
            CheckpointProblem(str(path), "missing: the trainer checkpoint has no trainer state")
        ]
    return [
        CheckpointProblem(str(path), f"trainer checkpoint file: {problem}")
        for path, problem in verify_trainer_checkpoint(Path(anchor.path))
    ]


def _all_leftovers(inventory: CheckpointInventory) -> list[str]:
    return inventory.leftovers + [path for a in inventory.anchors for path in a.leftovers]
