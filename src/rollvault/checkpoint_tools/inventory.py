"""What a checkpoint directory holds: its anchors, their snapshots, and leftovers.

An *anchor* is ``bootstrap/`` or a trainer checkpoint ``step_<N>/``. Each
trainer checkpoint carries a full snapshot in ``step_<N>/rollout_state/``
and, like the bootstrap anchor, committed rollout snapshots in
``rollout_snapshots/snapshot_<seq>/``. :func:`take_inventory` lists them all
with their manifest fields and a cheap summary of what each snapshot holds:
it reads the manifest, the data plane's ``metadata.json`` and the JSON
sidecars (checking their advertised SHA-256), and only stats the tensor
files. A damaged snapshot is listed with the first problem found, never
raised. ``tmp_`` and ``trash_`` directories are never read, only named as
leftovers of an interrupted write or prune.

This is what ``rollvault inspect`` prints and what ``rollvault verify``
walks before verifying every snapshot fully.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from rollvault.controller.data.shortfall import SparePromptsState
from rollvault.controller.snapshots.checkpointer import (
    TRAINER_ROLLOUT_STATE_DIRNAME,
    TRAINER_STATE_DIRNAME,
)
from rollvault.controller.snapshots.snapshot_files import (
    DATA_PLANE_DIRNAME,
    REPLACEMENT_RESERVE_FILENAME,
    SnapshotCorruptError,
    advertised_digests,
    checked_bytes,
    data_plane_refusals,
    decode_replay_buffer,
    read_facts,
    read_recovery_sidecar_indexed,
    segments_dir_for,
)
from rollvault.controller.snapshots.verification import ledger_of, problem_from_error
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION
from rollvault.dataplane.segmented_index import CheckpointSummary, checkpoint_summary
from rollvault.durable.bootstrap import (
    BootstrapAnchorManifest,
    holds_run,
    read_bootstrap_manifest,
)
from rollvault.durable.errors import IncompatibleRunError, SnapshotError, SnapshotManifestError
from rollvault.durable.layout import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    ROLLOUT_SNAPSHOT_MANIFEST_FILENAME,
    SEGMENTS_DIRNAME,
)
from rollvault.durable.manifest_schema import RolloutSnapshotManifest, read_snapshot_manifest
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_path, trainer_checkpoint_steps
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus

_LEFTOVER_PREFIXES: Final = ("tmp_", "trash_")
_SNAPSHOT_PREFIX: Final = "snapshot_"
_T = TypeVar("_T")


class AnchorKind(StrEnum):
    """What owns a ``rollout_snapshots/`` directory."""

    BOOTSTRAP = "bootstrap"
    TRAINER_CHECKPOINT = "trainer_checkpoint"


class SnapshotKind(StrEnum):
    """Where a snapshot lives: a trainer checkpoint's own, or a periodic rollout snapshot."""

    TRAINER_CHECKPOINT = "trainer_checkpoint"
    """``step_<N>/rollout_state``, taken with the trainer checkpoint itself."""
    ROLLOUT_SNAPSHOT = "rollout_snapshot"
    """``<anchor>/rollout_snapshots/snapshot_<seq>``."""


class CheckpointProblem(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One thing wrong with one file (or directory) of a checkpoint directory."""

    path: str
    problem: str


class SiblingCounts(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Siblings of the ledger's groups by the status of their current attempt."""

    sealed: int
    in_flight: int
    """Current attempt reserved or dispatched: redispatched by a restore."""
    failed: int
    abandoned: int
    mid_episode: int = 0
    """In-flight siblings whose episode has committed turns (restore continues them there)."""
    turns_committed: int = 0
    """Committed turns of those episodes: the multi-turn work a restore keeps."""


class SnapshotContents(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one snapshot holds, from its metadata and sidecars (no tensors read)."""

    groups_by_status: dict[PromptGroupStatus, int]
    """Ledger groups (still generating or finalizing) per status, every status listed."""
    canonical_groups: int
    """Finalized groups waiting in the replay index (rolled-back ones included)."""
    siblings: SiblingCounts
    staged_rows: int
    train_rows: int
    spare_prompts: int
    shortfall_groups: int
    """Groups permanently lost, over all target steps."""


class SnapshotEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One snapshot directory; ``damage`` is set when the cheap read found a problem."""

    kind: SnapshotKind
    path: str
    sequence: int | None
    age_s: float | None
    """Seconds since its ``manifest.json`` was written; None without a manifest."""
    bytes_on_disk: int
    manifest: RolloutSnapshotManifest | None
    contents: SnapshotContents | None
    damage: CheckpointProblem | None


class AnchorEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``bootstrap/`` or ``step_<N>/`` and every snapshot under it, oldest first."""

    kind: AnchorKind
    path: str
    step: int
    trainer_state_bytes: int | None
    """Bytes of ``step_<N>/trainer/``; None for the bootstrap anchor or when it is absent."""
    shared_segment_bytes: int
    """Bytes of ``rollout_snapshots/segments/``: the token rows and ledger records its
    snapshots share (written once, referenced by every snapshot that holds them), which
    no snapshot's own ``bytes_on_disk`` counts."""
    snapshots: list[SnapshotEntry]
    leftovers: list[str]


class BootstrapEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The bootstrap anchor's ``manifest.json``: the run's compatibility identity."""

    path: str
    schema_version: int | None
    fingerprint: str | None
    generations_per_group: int | None
    """``grpo.num_generations_per_prompt`` of the stored config, when it records one."""
    damage: CheckpointProblem | None


class CheckpointInventory(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything :func:`take_inventory` found in one checkpoint directory."""

    checkpoint_dir: str
    bootstrap: BootstrapEntry
    anchors: list[AnchorEntry]
    leftovers: list[str]
    """``tmp_step_<N>`` / ``trash_step_<N>`` directories beside the trainer checkpoints."""


def no_run_message(checkpoint_dir: Path) -> str:
    """Why ``checkpoint_dir`` holds no run to look at, with a hint when there is one."""
    if not checkpoint_dir.exists():
        return f"{checkpoint_dir} does not exist"
    if not checkpoint_dir.is_dir():
        return f"{checkpoint_dir} is not a directory"
    # A run's root (runs/<name>/) holds checkpoints/ beside logs/.
    nested = checkpoint_dir / "checkpoints"
    hint = f" (did you mean {nested}?)" if nested.is_dir() and holds_run(nested) else ""
    return f"{checkpoint_dir} holds no run (no bootstrap/ anchor, no step_<N>/ checkpoint){hint}"


def take_inventory(checkpoint_dir: Path, *, now: float) -> CheckpointInventory:
    """List every anchor and snapshot of ``checkpoint_dir``; ages are relative to ``now``.

    Never raises for a damaged file: each problem is recorded on its entry.
    """
    anchors = [_bootstrap_anchor(checkpoint_dir, now)] if _has_bootstrap(checkpoint_dir) else []
    anchors += [
        _trainer_anchor(checkpoint_dir, step, now)
        for step in trainer_checkpoint_steps(checkpoint_dir)
    ]
    return CheckpointInventory(
        checkpoint_dir=str(checkpoint_dir),
        bootstrap=read_bootstrap_entry(checkpoint_dir / BOOTSTRAP_DIRNAME),
        anchors=anchors,
        leftovers=_leftovers(checkpoint_dir),
    )


def _has_bootstrap(checkpoint_dir: Path) -> bool:
    return (checkpoint_dir / BOOTSTRAP_DIRNAME).is_dir()


def read_bootstrap_entry(anchor: Path) -> BootstrapEntry:
    """Read ``bootstrap/manifest.json`` strictly and check its fingerprint against its identity."""
    path = anchor / BOOTSTRAP_MANIFEST_FILENAME
    try:
        stored = read_bootstrap_manifest(anchor)
    except IncompatibleRunError as exc:
        return _bootstrap_damage(path, "; ".join(exc.differences))
    except SnapshotManifestError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            # The durable reader cannot know that a run is there; here there is.
            return _bootstrap_damage(path, "missing; the run's compatibility identity is lost")
        return _bootstrap_damage(path, str(exc).removeprefix(f"{path}: "))
    return BootstrapEntry(
        path=str(path),
        schema_version=stored.schema_version,
        fingerprint=stored.fingerprint,
        generations_per_group=_generations_per_group(stored.config),
        damage=_bootstrap_problem(path, stored),
    )


def _bootstrap_damage(path: Path, problem: str) -> BootstrapEntry:
    return BootstrapEntry(
        path=str(path),
        schema_version=None,
        fingerprint=None,
        generations_per_group=None,
        damage=CheckpointProblem(str(path), problem),
    )


def _bootstrap_problem(path: Path, stored: BootstrapAnchorManifest) -> CheckpointProblem | None:
    if stored.fingerprint_matches_identity():
        return None
    return CheckpointProblem(
        str(path),
        f"corrupt: fingerprint {stored.fingerprint} does not match the identity stored "
        f"beside it ({stored.stored_identity().fingerprint()})",
    )


def _generations_per_group(config: dict[str, Any]) -> int | None:
    grpo = config.get("grpo")
    value = grpo.get("num_generations_per_prompt") if isinstance(grpo, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bootstrap_anchor(checkpoint_dir: Path, now: float) -> AnchorEntry:
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    return AnchorEntry(
        kind=AnchorKind.BOOTSTRAP,
        path=str(anchor),
        step=0,
        trainer_state_bytes=None,
        shared_segment_bytes=tree_bytes(snapshots_root(anchor) / SEGMENTS_DIRNAME),
        snapshots=_rollout_snapshots(anchor, now),
        leftovers=_leftovers(anchor) + _leftovers(snapshots_root(anchor)),
    )


def _trainer_anchor(checkpoint_dir: Path, step: int, now: float) -> AnchorEntry:
    anchor = trainer_checkpoint_path(checkpoint_dir, step)
    trainer_dir = anchor / TRAINER_STATE_DIRNAME
    own = read_snapshot_entry(
        anchor / TRAINER_ROLLOUT_STATE_DIRNAME, SnapshotKind.TRAINER_CHECKPOINT, now=now
    )
    return AnchorEntry(
        kind=AnchorKind.TRAINER_CHECKPOINT,
        path=str(anchor),
        step=step,
        trainer_state_bytes=tree_bytes(trainer_dir) if trainer_dir.is_dir() else None,
        shared_segment_bytes=tree_bytes(snapshots_root(anchor) / SEGMENTS_DIRNAME),
        snapshots=[own, *_rollout_snapshots(anchor, now)],
        leftovers=_leftovers(snapshots_root(anchor)),
    )


def _rollout_snapshots(anchor: Path, now: float) -> list[SnapshotEntry]:
    return [
        read_snapshot_entry(path, SnapshotKind.ROLLOUT_SNAPSHOT, now=now)
        for path in committed_snapshot_paths(snapshots_root(anchor))
    ]


def _leftovers(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(
        str(entry) for entry in directory.iterdir() if entry.name.startswith(_LEFTOVER_PREFIXES)
    )


def read_snapshot_entry(path: Path, kind: SnapshotKind, *, now: float) -> SnapshotEntry:
    """Summarize one snapshot directory cheaply; a problem is recorded, not raised."""
    manifest: RolloutSnapshotManifest | None = None
    contents: SnapshotContents | None = None
    damage: CheckpointProblem | None = None
    try:
        manifest = read_snapshot_manifest(path)
        contents = read_snapshot_contents(path)
    except (SnapshotError, DataPlaneCheckpointError, OSError) as exc:
        damage = problem_of(exc, path / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME)
    return SnapshotEntry(
        kind=kind,
        path=str(path),
        sequence=_sequence(path) if kind is SnapshotKind.ROLLOUT_SNAPSHOT else None,
        age_s=_age(path / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME, now),
        bytes_on_disk=tree_bytes(path),
        manifest=manifest,
        contents=contents,
        damage=damage,
    )


def problem_of(
    exc: SnapshotError | DataPlaneCheckpointError | OSError, path: Path
) -> CheckpointProblem:
    """The file and problem an error names; ``path`` when the error carries no path."""
    found = problem_from_error(exc, path)
    return CheckpointProblem(str(found.path), found.problem)


def _sequence(path: Path) -> int:
    # committed_snapshot_paths only yields names matching snapshot_<digits>.
    return int(path.name.removeprefix(_SNAPSHOT_PREFIX))


def _age(path: Path, now: float) -> float | None:
    try:
        return max(now - path.stat().st_mtime, 0.0)
    except FileNotFoundError:
        return None


def tree_bytes(directory: Path) -> int:
    """Bytes of every regular file under ``directory``, symlinks not followed."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue  # removed between the listing and the stat: it no longer counts
    return total


def read_snapshot_contents(path: Path) -> SnapshotContents:
    """Count what a snapshot holds from its metadata and sidecars.

    Checks every sidecar's SHA-256 against ``data_plane/metadata.json`` and
    each tensor file's size (not its checksum). Raises
    :class:`SnapshotCorruptError` naming the first bad file.
    """
    data_plane = path / DATA_PLANE_DIRNAME
    with data_plane_refusals():
        content = checkpoint_summary(data_plane, segments_dir_for(path))
    _check_file_sizes(content)
    digests = advertised_digests(data_plane, content.user_metadata)
    raw = {
        name: checked_bytes(path / name, digest)
        for name, digest in digests.items()
        if name != ROLLOUT_RECOVERY_STATE_FILENAME
    }
    facts = read_facts(path, raw)  # the fact segments are checked whole, as restore does
    recovery, _indexed = read_recovery_sidecar_indexed(
        path / ROLLOUT_RECOVERY_STATE_FILENAME, digests, facts=facts
    )
    ledger = ledger_of(path / ROLLOUT_RECOVERY_STATE_FILENAME, recovery.ledger_state)
    replay = decode_replay_buffer(path, raw, facts)
    spares = _decode(path / REPLACEMENT_RESERVE_FILENAME, raw, SparePromptsState)
    rows = content.row_counts
    return SnapshotContents(
        groups_by_status=_groups_by_status(ledger),
        canonical_groups=len(replay.replay.entries),
        siblings=_sibling_counts(ledger),
        staged_rows=rows.get(STAGING_PARTITION, 0),
        train_rows=rows.get(TRAIN_PARTITION, 0),
        spare_prompts=len(spares.prompts),
        shortfall_groups=sum(recovery.batch_shortfall.values()),
    )


def _check_file_sizes(content: CheckpointSummary) -> None:
    for file, recorded in content.files:
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise SnapshotCorruptError(file, f"cannot stat: {exc.strerror or exc}") from exc
        if size != recorded:
            raise SnapshotCorruptError(
                file,
                f"size is {size} bytes, metadata.json records {recorded} "
                "(truncated or overwritten)",
            )


def _decode(path: Path, raw: dict[str, bytes], kind: type[_T]) -> _T:
    try:
        return msgspec.json.decode(raw[path.name], type=kind, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc


def _groups_by_status(ledger: RolloutRecoveryLedger) -> dict[PromptGroupStatus, int]:
    counts = dict.fromkeys(PromptGroupStatus, 0)
    for record in ledger.groups():
        counts[record.status] += 1
    return counts


def _sibling_counts(ledger: RolloutRecoveryLedger) -> SiblingCounts:
    counts = dict.fromkeys(RolloutAttemptStatus, 0)
    live = (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
    mid_episode = turns = 0
    for record in ledger.groups():
        for sibling in record.siblings:
            attempt = sibling.current_attempt
            counts[attempt.status] += 1
            if attempt.status in live and attempt.turn_keys:
                mid_episode += 1
                turns += len(attempt.turn_keys)
    return SiblingCounts(
        sealed=counts[RolloutAttemptStatus.SEALED],
        in_flight=counts[RolloutAttemptStatus.RESERVED] + counts[RolloutAttemptStatus.DISPATCHED],
        failed=counts[RolloutAttemptStatus.FAILED],
        abandoned=counts[RolloutAttemptStatus.ABANDONED],
        mid_episode=mid_episode,
        turns_committed=turns,
    )
