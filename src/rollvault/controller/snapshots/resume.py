"""Deciding how a start resumes: which checkpoint, which snapshot, or none.

A checkpoint directory holds a run when its bootstrap anchor or a trainer
checkpoint exists (``rollvault.durable.bootstrap.holds_run``). A start under
``restore_mode``:

- ``latest`` resumes from the newest trainer checkpoint ``step_<N>`` (or the
  bootstrap anchor) and its newest verified rollout snapshot; a corrupt or
  incompatible snapshot is skipped for the next older one, down to the full
  snapshot taken with the trainer checkpoint itself.
- ``trainer_checkpoint`` resumes from ``step_<N>`` and its own snapshot only,
  and regenerates every rollout after it: what other frameworks do, kept as
  the baseline rollvault is measured against.
- ``none`` starts fresh and refuses a directory that holds a run, unless
  ``force_fresh`` is set (then the old run's checkpoints and logs are removed).

Every mode but a forced fresh start first checks the run's compatibility
identity against the anchor and refuses a changed config, naming every
changed dotpath, then the dataset's rows against those the anchor recorded,
naming the changed rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rollvault.config.loading import config_to_dict
from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.controller.loop.run_logs import INCARNATION_FILENAME
from rollvault.controller.snapshots.checkpointer import (
    TRAINER_ROLLOUT_STATE_DIRNAME,
    TRAINER_STATE_DIRNAME,
)
from rollvault.controller.snapshots.dataset_check import check_dataset_unchanged, dataset_identity
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.controller.snapshots.verification import read_snapshot
from rollvault.durable.bootstrap import holds_run, open_bootstrap_anchor
from rollvault.durable.compatibility import (
    BootstrapCompatibilityIdentity,
    bootstrap_compatibility_identity,
)
from rollvault.durable.errors import NoUsableSnapshotError, SnapshotError
from rollvault.durable.file_digests import directory_digests
from rollvault.durable.fsync import _fsync_directory
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.manifest_schema import RolloutSnapshotManifest, read_snapshot_manifest
from rollvault.durable.resolve import resolve_latest_snapshot
from rollvault.durable.run_lock import RUN_LOCK_FILENAME
from rollvault.durable.trainer_checkpoints import (
    trainer_checkpoint_path,
    trainer_checkpoint_steps,
    verify_trainer_checkpoint,
)
from rollvault.durable.trash import remove_tree
from rollvault.rewards.identity import reward_function_identity
from rollvault.tasks.protocols import PromptDataset

_LOG = logging.getLogger("rollvault.resume")

DAMAGED_STEP_PREFIX: Final = "damaged_"
"""A skipped trainer checkpoint ``step_<N>`` is kept as ``damaged_step_<N>``: never read again."""


class RunExistsError(RuntimeError):
    """``restore_mode=none`` found a run in the checkpoint directory."""


@dataclass(frozen=True)
class ResumeSource:
    """What setup restores from; the restorer continues from it."""

    mode: RestoreMode
    base_step: int
    snapshot: LoadedSnapshot | None
    """The verified snapshot to restore (None: nothing to restore, start fresh)."""
    trainer_dir: Path | None
    """The trainer state to load (None at the bootstrap anchor)."""
    skipped: tuple[tuple[Path, str], ...] = ()
    """Newer trainer checkpoints that could not be used, with why (newest first)."""
    fingerprint: str | None = None
    """The fingerprint the run continues under: its anchor's, which differs from this
    config's own when an older rollvault wrote the anchor (None: this config's)."""


def run_identity(config: RunConfig) -> BootstrapCompatibilityIdentity:
    """The run's compatibility identity: its config less the operational paths.

    When ``model.path`` holds a model directory, the digest of each of its
    files joins the identity as ``model.files`` (``model.path`` itself is
    operational): the model is its weights, config and tokenizer, not where
    they happen to lie.

    With ``reward.function`` set, the SHA-256 of the function's source file
    joins it as ``reward.function_sha256`` (see
    :mod:`rollvault.rewards.identity`): changed reward code refuses a resume,
    naming that key. A function that cannot be located raises its
    ``ConfigError``.
    """
    data = config_to_dict(config)
    model_dir = Path(config.model.path)
    if model_dir.is_dir():
        data["model"]["files"] = directory_digests(model_dir)
    if config.reward.function is not None:
        identity = reward_function_identity(config.reward.function)
        data["reward"]["function_sha256"] = identity.source_sha256
    return bootstrap_compatibility_identity(data)


def run_fingerprint(config: RunConfig) -> str:
    """The run's compatibility fingerprint, stored in every snapshot manifest."""
    return run_identity(config).fingerprint()


def prepare_checkpoint_dir(
    config: RunConfig, *, dataset: PromptDataset | None = None
) -> ResumeSource | None:
    """Check the directory against ``config`` and pick what to resume from.

    With ``dataset`` (the run's), a new anchor records its rows' identity
    digests and a resume refuses a dataset whose rows differ from those
    (:mod:`rollvault.controller.snapshots.dataset_check`); without it (tools
    that only read a finished run's state) the rows are neither recorded nor
    checked.

    Returns None for a fresh start. Raises ``IncompatibleRunError`` on a
    changed config, ``DatasetChangedError`` (an ``IncompatibleRunError``) on
    changed dataset rows, :class:`RunExistsError` for ``none`` without
    ``force_fresh``, and ``NoUsableSnapshotError`` when snapshots exist but
    none can be used.
    """
    return plan_resume(config, dataset=dataset).resume


@dataclass(frozen=True)
class ResumePlan:
    """A checked checkpoint directory: what to resume from and the fingerprint to go on under."""

    resume: ResumeSource | None
    """None: a fresh start."""
    fingerprint: str
    """The fingerprint new snapshots carry: the anchor's (on a resume it may differ from
    this config's own when an older rollvault wrote the anchor)."""


def plan_resume(config: RunConfig, *, dataset: PromptDataset | None = None) -> ResumePlan:
    """:func:`prepare_checkpoint_dir`, also returning the fingerprint the run goes on under.

    The run's identity (which digests every model file) is computed once and
    the anchor's manifest read once, whether the start is fresh or resumes.
    """
    settings = config.rollout_checkpointing
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    identity = run_identity(config)
    rows = dataset_identity(dataset) if dataset is not None else None
    existing = holds_run(checkpoint_dir)
    if settings.restore_mode is RestoreMode.NONE and existing:
        if not settings.force_fresh:
            raise RunExistsError(
                f"{checkpoint_dir} holds a run; restore_mode=none refuses to overwrite it "
                "(set rollout_checkpointing.force_fresh=true to delete it and start fresh)"
            )
        _remove_run(checkpoint_dir, Path(config.logging.log_dir))
        existing = False
    # Creates the anchor for a new run; for an existing one, refuses a changed config.
    # Its fingerprint is the manifest's, not this config's: they differ when an older
    # rollvault wrote the anchor before some settings existed, and its snapshots carry
    # the anchor's.
    anchor = open_bootstrap_anchor(checkpoint_dir, identity=identity, dataset_identity=rows)
    if not existing:
        return ResumePlan(None, anchor.fingerprint)
    if dataset is not None:
        # After the config check: a changed seed or num_prompts changes rows too, and
        # the changed setting is the better message.
        check_dataset_unchanged(anchor.path, dataset, rows)
    source = _resume_source(config, checkpoint_dir, anchor.fingerprint)
    return ResumePlan(
        dataclasses.replace(source, fingerprint=anchor.fingerprint), anchor.fingerprint
    )


def _remove_run(checkpoint_dir: Path, log_dir: Path) -> None:
    """``force_fresh``: delete the old run, and only what is provably rollvault's.

    The checkpoint directory holds a run (its anchor or a trainer checkpoint
    was found); everything in it goes but the run lock this start holds. The
    log directory goes only if it carries the start counter every rollvault
    start writes first: ``logging.log_dir`` may point anywhere, and a
    directory of someone else's files is refused, before anything is deleted.
    """
    foreign = not (log_dir / INCARNATION_FILENAME).is_file()
    if log_dir.is_dir() and any(log_dir.iterdir()) and foreign:
        raise RunExistsError(
            f"force_fresh: logging.log_dir {log_dir} holds files but no "
            f"{INCARNATION_FILENAME!r} counter, so it is not provably rollvault's run logs; "
            "refusing to delete it (empty it yourself or choose another logging.log_dir)"
        )
    for entry in checkpoint_dir.iterdir():
        if entry.name == RUN_LOCK_FILENAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if log_dir.is_dir():
        shutil.rmtree(log_dir)


def _resume_source(config: RunConfig, checkpoint_dir: Path, fingerprint: str) -> ResumeSource:
    """The newest usable trainer checkpoint and snapshot, skipping damaged ones.

    DESIGN invariant 6 (fall back to the next older committed snapshot) holds
    across trainer checkpoints too: ``step_<N>`` whose files fail their
    digests, or none of whose snapshots verifies, is skipped for the next
    older one, whose trainer state is loaded with it. What was skipped is
    moved aside as ``damaged_step_<N>`` (so the run can publish ``step_<N>``
    again when it gets there) and named in ``ResumeSource.skipped``. Before
    the first trainer checkpoint the bootstrap anchor is the only source.
    """
    steps = trainer_checkpoint_steps(checkpoint_dir)
    if not steps:
        return _source_at(config, None, 0, checkpoint_dir / BOOTSTRAP_DIRNAME, fingerprint)
    skipped: list[tuple[Path, str]] = []
    for step in reversed(steps):
        step_dir = trainer_checkpoint_path(checkpoint_dir, step)
        problems = verify_trainer_checkpoint(step_dir)
        if problems:
            skipped.append((step_dir, "; ".join(f"{path}: {why}" for path, why in problems)))
            continue
        try:
            source = _source_at(config, step_dir, step, step_dir, fingerprint)
        except NoUsableSnapshotError as exc:
            skipped.append((step_dir, str(exc)))
            continue
        return dataclasses.replace(source, skipped=_set_aside(skipped))
    raise NoUsableSnapshotError(checkpoint_dir, skipped)


def _source_at(
    config: RunConfig, step_dir: Path | None, step: int, anchor: Path, fingerprint: str
) -> ResumeSource:
    """Resume at ``step`` (``step_dir`` None: the bootstrap anchor) or raise NoUsableSnapshotError."""
    mode = config.rollout_checkpointing.restore_mode
    per_group = config.grpo.num_generations_per_prompt
    trainer_dir = step_dir / TRAINER_STATE_DIRNAME if step_dir else None
    if mode is RestoreMode.TRAINER_CHECKPOINT:
        snapshot = _embedded_snapshot(step_dir, per_group) if step_dir else None
        return ResumeSource(mode, step, snapshot, trainer_dir)
    loaded: dict[Path, LoadedSnapshot] = {}

    def verify(path: Path, manifest: RolloutSnapshotManifest) -> None:
        loaded[path] = read_snapshot(path, manifest, generations_per_group=per_group)

    try:
        resolved = resolve_latest_snapshot(
            anchor,
            expected_train_step=step,
            expected_trainer_version=step,
            expected_bootstrap_fingerprint=fingerprint,
            verify_snapshot=verify,
        )
    except NoUsableSnapshotError as periodic:
        if step_dir is None:
            raise
        # The trainer checkpoint's own snapshot is the oldest fallback at this step.
        try:
            embedded = _embedded_snapshot(step_dir, per_group)
        except NoUsableSnapshotError as own:
            raise NoUsableSnapshotError(step_dir, periodic.rejected + own.rejected) from own
        return ResumeSource(mode, step, embedded, trainer_dir)
    if resolved is not None:
        return ResumeSource(mode, step, loaded[resolved.path], trainer_dir)
    snapshot = _embedded_snapshot(step_dir, per_group) if step_dir else None
    return ResumeSource(mode, step, snapshot, trainer_dir)


def _set_aside(skipped: list[tuple[Path, str]]) -> tuple[tuple[Path, str], ...]:
    """Rename each skipped ``step_<N>`` to ``damaged_step_<N>`` (kept for the operator)."""
    kept = []
    for step_dir, reason in skipped:
        aside = step_dir.with_name(f"{DAMAGED_STEP_PREFIX}{step_dir.name}")
        if aside.exists():
            remove_tree(aside)  # an older damaged copy of the same step, already reported
        os.rename(step_dir, aside)
        _LOG.warning("skipped trainer checkpoint %s (moved to %s): %s", step_dir, aside, reason)
        kept.append((step_dir, f"{reason} (moved to {aside.name})"))
    if skipped:
        _fsync_directory(skipped[0][0].parent)
    return tuple(kept)


def _embedded_snapshot(step_dir: Path, generations_per_group: int) -> LoadedSnapshot:
    path = step_dir / TRAINER_ROLLOUT_STATE_DIRNAME
    try:
        manifest = read_snapshot_manifest(path)
    except SnapshotError as exc:
        raise NoUsableSnapshotError(step_dir, [(path, str(exc))]) from exc
    return read_snapshot(path, manifest, generations_per_group=generations_per_group)
