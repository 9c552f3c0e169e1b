"""Verifying a checkpoint directory fully: what ``rollvault verify CKPT_DIR`` checks.

For each committed rollout snapshot and each trainer checkpoint's
``rollout_state``: the manifest (schema, and that it names its anchor's step
and the run's fingerprint), every sidecar's SHA-256 against the data plane's
metadata, and then everything restore checks (``read_snapshot``: the data
plane's files and checksums, schemas, group counts, and that every staging
key a sealed attempt names and every canonical row exists). On top of that,
the other direction: no row that nothing references. Also the bootstrap
anchor (strict schema, fingerprint consistent with the identity beside it)
and each trainer checkpoint's ``trainer/`` directory.

:func:`verify_checkpoint_dir` returns every problem, each naming its file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from rollvault.checkpoint_tools.inventory import (
    AnchorEntry,
    AnchorKind,
    CheckpointInventory,
    CheckpointProblem,
    ledger_of,
    problem_of,
    take_inventory,
)
from rollvault.controller.snapshots.checkpointer import TRAINER_STATE_DIRNAME
from rollvault.controller.snapshots.snapshot_files import (
    DATA_PLANE_DIRNAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    LoadedSnapshot,
    SnapshotCorruptError,
    advertised_digests,
    checked_bytes,
)
from rollvault.controller.snapshots.verification import read_snapshot
from rollvault.dataplane.checkpoint_format import partition_file_name
from rollvault.dataplane.checkpoint_io import read_checkpoint_metadata
from rollvault.dataplane.errors import DataPlaneCheckpointError, DataPlaneValidationError
from rollvault.dataplane.interface import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    parse_staging_key,
    train_key,
)
from rollvault.durable.errors import SnapshotError
from rollvault.durable.layout import ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
from rollvault.durable.manifest_schema import RolloutSnapshotManifest, read_snapshot_manifest
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus

_SHOWN_KEYS: Final = 3
_IN_FLIGHT: Final = frozenset({RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED})
# A crash between publishing canonical rows and leaving the ledger leaves both;
# restore keeps the rows it finds, so they are expected, not orphans.
_MAY_HOLD_CANONICAL_ROWS: Final = frozenset(
    {PromptGroupStatus.FINALIZING, PromptGroupStatus.FINALIZATION_UNKNOWN}
)


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
    for anchor in inventory.anchors:
        problems += _trainer_state_problems(anchor)
        for snapshot in anchor.snapshots:
            checked.append(snapshot.path)
            problems += verify_snapshot(
                Path(snapshot.path),
                step=anchor.step,
                fingerprint=bootstrap.fingerprint,
                generations_per_group=bootstrap.generations_per_group,
            )
    return VerifyReport(
        checkpoint_dir=str(checkpoint_dir),
        ok=not problems,
        snapshots_checked=checked,
        problems=problems,
        leftovers=_all_leftovers(inventory),
    )


def _trainer_state_problems(anchor: AnchorEntry) -> list[CheckpointProblem]:
    if anchor.kind is not AnchorKind.TRAINER_CHECKPOINT or anchor.trainer_state_bytes is not None:
        return []
    path = Path(anchor.path) / TRAINER_STATE_DIRNAME
    return [CheckpointProblem(str(path), "missing: the trainer checkpoint has no trainer state")]


def _all_leftovers(inventory: CheckpointInventory) -> list[str]:
    return inventory.leftovers + [path for a in inventory.anchors for path in a.leftovers]


def verify_snapshot(
    path: Path, *, step: int, fingerprint: str | None, generations_per_group: int | None
) -> list[CheckpointProblem]:
    """Every problem of the snapshot at ``path``, anchored at trainer step ``step``.

    ``fingerprint`` and ``generations_per_group`` come from the bootstrap
    anchor; None (an unreadable anchor, already reported) skips what needs them.
    """
    manifest_path = path / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
    try:
        manifest = read_snapshot_manifest(path)
    except SnapshotError as exc:
        return [problem_of(exc, manifest_path)]
    problems = _manifest_problems(manifest_path, manifest, step=step, fingerprint=fingerprint)
    problems += _sidecar_checksum_problems(path)
    try:
        # Without a known group size the per-group count below stands in for it.
        loaded = read_snapshot(path, manifest, generations_per_group=generations_per_group or 0)
    except (SnapshotError, OSError) as exc:
        problem = problem_of(exc, path)
        return problems if problem in problems else [*problems, problem]
    try:
        return problems + cross_reference_problems(
            loaded, generations_per_group=generations_per_group
        )
    except SnapshotError as exc:
        return [*problems, problem_of(exc, path)]


def _manifest_problems(
    path: Path, manifest: RolloutSnapshotManifest, *, step: int, fingerprint: str | None
) -> list[CheckpointProblem]:
    checks: list[tuple[str, object, object]] = [
        ("base_train_step", manifest.base_train_step, step),
        ("trainer_version", manifest.trainer_version, step),
    ]
    if fingerprint is not None:
        checks.append(("bootstrap_fingerprint", manifest.bootstrap_fingerprint, fingerprint))
    return [
        CheckpointProblem(str(path), f"{name} is {found!r}; its anchor requires {wanted!r}")
        for name, found, wanted in checks
        if found != wanted
    ]


def _sidecar_checksum_problems(path: Path) -> list[CheckpointProblem]:
    """Each sidecar whose SHA-256 differs from the advertised one, all of them, not the first."""
    data_plane = path / DATA_PLANE_DIRNAME
    try:
        digests = advertised_digests(data_plane, read_checkpoint_metadata(data_plane).user_metadata)
    except (SnapshotError, DataPlaneCheckpointError):
        return []  # read_snapshot names the damaged metadata
    problems = []
    for name, digest in digests.items():
        try:
            checked_bytes(path / name, digest)
        except SnapshotCorruptError as exc:
            problems.append(problem_of(exc, path / name))
    return problems


def cross_reference_problems(
    snapshot: LoadedSnapshot, *, generations_per_group: int | None
) -> list[CheckpointProblem]:
    """What ``read_snapshot`` does not check: orphan rows and group sizes.

    A staged row must belong to a sealed current attempt of a ledger group,
    or to a current attempt still in flight (the gate writes its rows before
    the attempt is sealed; restore drops them and runs the attempt again). A
    train row must be a canonical row of a replay-index group (one per
    canonical attempt), or of a ledger group caught mid-finalization.
    """
    ledger = ledger_of(
        snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME, snapshot.recovery.ledger_state
    )
    problems = _group_size_problems(snapshot, ledger, generations_per_group)
    problems += _orphan_staged_rows(snapshot, ledger)
    problems += _canonical_row_problems(snapshot, ledger)
    return problems


def _group_size_problems(
    snapshot: LoadedSnapshot, ledger: RolloutRecoveryLedger, expected: int | None
) -> list[CheckpointProblem]:
    if expected is None:
        return []
    problems = [
        CheckpointProblem(
            str(snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME),
            f"group {record.group_id!r} expects {record.expected_generations} generations; "
            f"the run makes {expected} per prompt",
        )
        for record in ledger.groups()
        if record.expected_generations != expected
    ]
    problems += [
        CheckpointProblem(
            str(snapshot.path / REPLAY_BUFFER_METADATA_FILENAME),
            f"canonical group {group_id!r} lists {len(attempts)} attempts; "
            f"the run makes {expected} per prompt",
        )
        for group_id, attempts in snapshot.replay.canonical_attempts.items()
        if len(attempts) != expected
    ]
    return problems


def _orphan_staged_rows(
    snapshot: LoadedSnapshot, ledger: RolloutRecoveryLedger
) -> list[CheckpointProblem]:
    staged = snapshot.data_plane.partitions.get(STAGING_PARTITION, {})
    sealed = ledger.expected_staging_keys()
    in_flight = {
        record.gate_rollout_id(sibling.generation_index)
        for record in ledger.groups()
        for sibling in record.siblings
        if sibling.current_attempt.status in _IN_FLIGHT
    }
    orphans = [key for key in staged if key not in sealed and _staged_by(key) not in in_flight]
    return _row_problem(
        snapshot,
        STAGING_PARTITION,
        orphans,
        f"referenced by no sealed or in-flight current attempt in {ROLLOUT_RECOVERY_STATE_FILENAME}",
    )


def _staged_by(key: str) -> str | None:
    try:
        return parse_staging_key(key).gate_rollout_id
    except DataPlaneValidationError:
        return None  # not a staging key at all: it cannot be any attempt's row


def _canonical_row_problems(
    snapshot: LoadedSnapshot, ledger: RolloutRecoveryLedger
) -> list[CheckpointProblem]:
    train = snapshot.data_plane.partitions.get(TRAIN_PARTITION, {})
    attempts = snapshot.replay.canonical_attempts
    required = {
        train_key(entry.group_id, index)
        for entry in snapshot.replay.replay.entries
        for index in range(len(attempts.get(entry.group_id, ())))
    }
    tolerated = {
        train_key(record.group_id, index)
        for record in ledger.groups()
        if record.status in _MAY_HOLD_CANONICAL_ROWS
        for index in range(record.expected_generations)
    }
    orphans = [key for key in train if key not in required and key not in tolerated]
    missing = sorted(required.difference(train))
    problems = _row_problem(
        snapshot, TRAIN_PARTITION, orphans, "belonging to no group of the replay index"
    )
    if missing:
        problems.append(
            CheckpointProblem(
                str(snapshot.path / REPLAY_BUFFER_METADATA_FILENAME),
                f"names {len(missing)} canonical rows data_plane/ does not hold: {_some(missing)}",
            )
        )
    return problems


def _row_problem(
    snapshot: LoadedSnapshot, partition: str, keys: list[str], why: str
) -> list[CheckpointProblem]:
    if not keys:
        return []
    path = snapshot.path / DATA_PLANE_DIRNAME / partition_file_name(partition)
    return [
        CheckpointProblem(
            str(path), f"{len(keys)} orphan {partition} rows, {why}: {_some(sorted(keys))}"
        )
    ]


def _some(keys: Iterable[str]) -> str:
    keys = list(keys)
    shown = ", ".join(repr(key) for key in keys[:_SHOWN_KEYS])
    more = len(keys) - _SHOWN_KEYS
    return f"{shown} and {more} more" if more > 0 else shown
