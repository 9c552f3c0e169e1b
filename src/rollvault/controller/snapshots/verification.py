"""Verifying one rollout snapshot: the checks restore, ``rollvault verify`` and chaos share.

:func:`verify_snapshot` reads a snapshot directory and checks it;
:func:`verify_loaded_snapshot` checks one already decoded. Both return every
problem found, each naming its file and its cause (:class:`SnapshotProblem`).
How far they go is the :class:`VerificationLevel`:

- ``RESTORABLE``, what restore needs: every file reads and matches the
  checksum, schema and group count the data plane's metadata advertises,
  and every segment it references exists and matches the size and SHA-256
  recorded for it (the first damaged file or segment stops the read, and is
  named), and every cross-reference holds:
  each group has an origin, each sealed attempt's staged rows and each
  canonical row exist, each canonical group names its attempts, and groups
  have the run's size.
- ``FULL``, what ``rollvault verify`` checks: also each sidecar's checksum on
  its own (every damaged file is named, not only the first), the manifest
  against its anchor, the environment-state sidecar (``env_rollouts.json``)
  against the ledger's committed turns, and the other direction: no row that nothing
  references. Rows of an attempt still in flight (the gate writes them before
  the attempt seals) and of a group caught mid-finalization are expected.
- ``FINISHED``, what the chaos harness checks on a finished run's final
  snapshot: also nothing left to generate or train, and no row may belong to
  work in progress.

:func:`read_snapshot` is what restore calls: verify at ``RESTORABLE`` and
return the decoded snapshot, or raise :class:`SnapshotCorruptError` naming
the first problem, so that restore falls back to an older snapshot.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rollvault.controller.snapshots.fact_index import GROUP_FACTS_FILENAME
from rollvault.controller.snapshots.gc_pause import cyclic_gc_paused
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    DATA_PLANE_DIRNAME,
    ENV_ROLLOUTS_FILENAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    LoadedSnapshot,
    SnapshotCorruptError,
    advertised_digests,
    checked_bytes,
    read_snapshot_files,
    segments_dir_for,
)
from rollvault.dataplane.checkpoint_format import METADATA_FILENAME, partition_file_name
from rollvault.dataplane.errors import DataPlaneCheckpointError, DataPlaneValidationError
from rollvault.dataplane.interface import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    parse_staging_key,
    train_key,
)
from rollvault.dataplane.segmented_index import checkpoint_summary
from rollvault.durable.errors import SnapshotError
from rollvault.durable.layout import ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
from rollvault.durable.manifest_schema import RolloutSnapshotManifest, read_snapshot_manifest
from rollvault.ledger.errors import LedgerError
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus
from rollvault.tasks.episodes import RestoreClass

_SHOWN_KEYS: Final = 3
_IN_FLIGHT: Final = frozenset({RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED})
# A crash between publishing canonical rows and leaving the ledger leaves both;
# restore keeps the rows it finds, so they are expected, not orphans.
_MAY_HOLD_CANONICAL_ROWS: Final = frozenset(
    {PromptGroupStatus.FINALIZING, PromptGroupStatus.FINALIZATION_UNKNOWN}
)


class VerificationLevel(enum.IntEnum):
    """How much :func:`verify_snapshot` checks; each level includes the ones before it."""

    RESTORABLE = 1
    """Every file intact and every cross-reference resolved: what restore needs."""
    FULL = 2
    """Also every damaged sidecar named, the manifest's anchor, and no orphan rows."""
    FINISHED = 3
    """Also nothing left to do and no rows of work in progress: a finished run."""


class ProblemKind(enum.StrEnum):
    """What sort of problem a :class:`SnapshotProblem` is."""

    DAMAGED = "damaged"
    """A file is missing or unreadable, or fails its checksum, schema or group count."""
    INCONSISTENT = "inconsistent"
    """Files disagree: a group without origin or attempt ids, or not of the run's size."""
    MISSING_ROWS = "missing_rows"
    """Rows a sidecar references that ``data_plane/`` does not hold."""
    ORPHAN_ROWS = "orphan_rows"
    """Rows of ``data_plane/`` that nothing references; restore drops them."""
    WRONG_ANCHOR = "wrong_anchor"
    """The manifest names another trainer step or run than its anchor's."""
    UNFINISHED = "unfinished"
    """Work left in the snapshot of a run that finished."""

    @property
    def blocks_restore(self) -> bool:
        """Whether restore must refuse a snapshot with this problem."""
        return self not in (ProblemKind.ORPHAN_ROWS, ProblemKind.UNFINISHED)


@dataclass(frozen=True)
class SnapshotProblem:
    """One problem of a snapshot: the file it is in and what is wrong."""

    kind: ProblemKind
    path: Path
    problem: str
    partition: str | None = None
    """For missing and orphan rows: the data-plane partition they are about."""
    keys: tuple[str, ...] = ()
    """For missing and orphan rows: every key, sorted."""


@dataclass(frozen=True)
class SnapshotVerification:
    """What :func:`verify_snapshot` found in one snapshot directory."""

    path: Path
    manifest: RolloutSnapshotManifest | None
    """None when ``manifest.json`` could not be read."""
    snapshot: LoadedSnapshot | None
    """The decoded snapshot; None when a file could not be read or decoded."""
    problems: tuple[SnapshotProblem, ...]

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def restorable_snapshot(self) -> LoadedSnapshot:
        """The decoded snapshot, unless a problem blocks its restore.

        Raises :class:`SnapshotCorruptError` naming the first such problem.
        """
        blocking = [problem for problem in self.problems if problem.kind.blocks_restore]
        if self.snapshot is not None and not blocking:
            return self.snapshot
        first = blocking[0] if blocking else self.problems[0]
        raise SnapshotCorruptError(first.path, first.problem)


def read_snapshot(
    path: Path, manifest: RolloutSnapshotManifest, *, generations_per_group: int | None
) -> LoadedSnapshot:
    """Read and verify every file of the snapshot at ``path``, as restore needs it.

    ``generations_per_group`` is the run's group size (None: not checked).
    Raises :class:`SnapshotCorruptError` naming the first bad file.
    """
    verification = verify_snapshot(
        path,
        manifest=manifest,
        generations_per_group=generations_per_group,
        level=VerificationLevel.RESTORABLE,
    )
    return verification.restorable_snapshot()


def verify_snapshot(
    path: Path,
    *,
    generations_per_group: int | None,
    level: VerificationLevel,
    manifest: RolloutSnapshotManifest | None = None,
    expected_step: int | None = None,
    expected_fingerprint: str | None = None,
) -> SnapshotVerification:
    """Every problem of the snapshot at ``path`` that ``level`` checks.

    ``manifest`` is read from ``path`` unless given. From ``FULL`` on, the
    manifest must name ``expected_step`` as its base step and trainer version
    and carry ``expected_fingerprint``; None skips either check (an
    unreadable bootstrap anchor, already reported), as ``generations_per_group``
    None skips the group sizes.
    """
    manifest_path = path / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
    if manifest is None:
        try:
            manifest = read_snapshot_manifest(path)
        except SnapshotError as exc:
            return SnapshotVerification(path, None, None, (problem_from_error(exc, manifest_path),))
    problems: list[SnapshotProblem] = []
    if level >= VerificationLevel.FULL:
        problems += _anchor_problems(manifest_path, manifest, expected_step, expected_fingerprint)
        problems += _sidecar_checksum_problems(path)
    try:
        with cyclic_gc_paused():  # it builds every record and row of the snapshot
            snapshot = read_snapshot_files(path, manifest)
    except (SnapshotError, OSError) as exc:
        problem = problem_from_error(exc, path)
        if problem not in problems:
            problems.append(problem)
        return SnapshotVerification(path, manifest, None, tuple(problems))
    problems += verify_loaded_snapshot(
        snapshot, generations_per_group=generations_per_group, level=level
    )
    return SnapshotVerification(path, manifest, snapshot, tuple(problems))


def verify_loaded_snapshot(
    snapshot: LoadedSnapshot, *, generations_per_group: int | None, level: VerificationLevel
) -> list[SnapshotProblem]:
    """Every problem between the files of a decoded snapshot that ``level`` checks."""
    problems = _origin_problems(snapshot)
    problems += _group_size_problems(snapshot, generations_per_group)
    problems += _missing_staged_rows(snapshot)
    problems += _canonical_group_problems(snapshot, generations_per_group)
    if level >= VerificationLevel.FULL:
        problems += _env_rollout_problems(snapshot)
        try:
            ledger = ledger_of(
                snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME, snapshot.recovery.ledger_state
            )
        except SnapshotCorruptError as exc:
            return [*problems, problem_from_error(exc, snapshot.path)]
        finished = level >= VerificationLevel.FINISHED
        problems += _orphan_staged_rows(snapshot, ledger, in_flight_expected=not finished)
        problems += _orphan_train_rows(
            snapshot, ledger, generations_per_group, finalizing_expected=not finished
        )
    if level >= VerificationLevel.FINISHED:
        problems += _unfinished_work(snapshot)
    return problems


def problem_from_error(
    exc: SnapshotError | DataPlaneCheckpointError | OSError, path: Path
) -> SnapshotProblem:
    """The damage an error names: its file and problem (``path`` when it names no file)."""
    if isinstance(exc, (SnapshotCorruptError, DataPlaneCheckpointError)):
        return SnapshotProblem(ProblemKind.DAMAGED, exc.path, exc.problem)
    if isinstance(exc, OSError):
        where = Path(exc.filename) if exc.filename is not None else path
        return SnapshotProblem(ProblemKind.DAMAGED, where, f"cannot read: {exc.strerror or exc}")
    # The durable layer's messages start with the path they are about.
    return SnapshotProblem(ProblemKind.DAMAGED, path, str(exc).removeprefix(f"{path}: "))


def ledger_of(path: Path, ledger_state: dict[str, Any]) -> RolloutRecoveryLedger:
    """The ledger a validated sidecar describes, to read its records with their enums."""
    try:
        return RolloutRecoveryLedger.from_state_dict(ledger_state)
    except LedgerError as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc


def _anchor_problems(
    path: Path, manifest: RolloutSnapshotManifest, step: int | None, fingerprint: str | None
) -> list[SnapshotProblem]:
    checks: list[tuple[str, object, object]] = []
    if step is not None:
        checks.append(("base_train_step", manifest.base_train_step, step))
        checks.append(("trainer_version", manifest.trainer_version, step))
    if fingerprint is not None:
        checks.append(("bootstrap_fingerprint", manifest.bootstrap_fingerprint, fingerprint))
    return [
        SnapshotProblem(
            ProblemKind.WRONG_ANCHOR, path, f"{name} is {found!r}; its anchor requires {wanted!r}"
        )
        for name, found, wanted in checks
        if found != wanted
    ]


def _sidecar_checksum_problems(path: Path) -> list[SnapshotProblem]:
    """Each sidecar whose SHA-256 differs from the advertised one, all of them, not the first."""
    data_plane = path / DATA_PLANE_DIRNAME
    try:
        summary = checkpoint_summary(data_plane, segments_dir_for(path))
        digests = advertised_digests(data_plane, summary.user_metadata)
    except (SnapshotError, DataPlaneCheckpointError):
        return []  # reading the files names the damaged metadata
    problems = []
    for name, digest in digests.items():
        try:
            checked_bytes(path / name, digest)
        except SnapshotCorruptError as exc:
            problems.append(problem_from_error(exc, path / name))
    return problems


def _facts_file(snapshot: LoadedSnapshot, older: str) -> Path:
    """The file that holds the per-group maps: the group facts' index, or ``older`` (the
    file that held them before group facts)."""
    return snapshot.path / (GROUP_FACTS_FILENAME if snapshot.facts is not None else older)


def _origin_problems(snapshot: LoadedSnapshot) -> list[SnapshotProblem]:
    origins = snapshot.controller.origins
    path = _facts_file(snapshot, CONTROLLER_STATE_FILENAME)
    problems = [
        SnapshotProblem(ProblemKind.INCONSISTENT, path, f"no origin for ledger group {group_id!r}")
        for group_id in (group.group_id for group in snapshot.recovery.ledger_groups())
        if group_id not in origins
    ]
    problems += [
        SnapshotProblem(
            ProblemKind.INCONSISTENT, path, f"no origin for canonical group {entry.group_id!r}"
        )
        for entry in snapshot.replay.replay.entries
        if entry.group_id not in origins
    ]
    return problems


def _group_size_problems(snapshot: LoadedSnapshot, expected: int | None) -> list[SnapshotProblem]:
    if expected is None:
        return []
    problems = [
        SnapshotProblem(
            ProblemKind.INCONSISTENT,
            snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME,
            f"group {group.group_id!r} expects {group.expected_generations} generations; "
            f"the run makes {expected} per prompt",
        )
        for group in snapshot.recovery.ledger_groups()
        if group.expected_generations != expected
    ]
    problems += [
        SnapshotProblem(
            ProblemKind.INCONSISTENT,
            _facts_file(snapshot, REPLAY_BUFFER_METADATA_FILENAME),
            f"canonical group {group_id!r} lists {len(attempts)} attempts; "
            f"the run makes {expected} per prompt",
        )
        for group_id, attempts in snapshot.replay.canonical_attempts.items()
        if len(attempts) != expected
    ]
    return problems


def _missing_staged_rows(snapshot: LoadedSnapshot) -> list[SnapshotProblem]:
    """Each sealed current attempt's staged rows must all be in ``data_plane/``."""
    staging = snapshot.data_plane.partitions.get(STAGING_PARTITION, {})
    held = staging.__contains__
    sealed = RolloutAttemptStatus.SEALED
    problems = []
    for group in snapshot.recovery.ledger_groups():
        for sibling in group.siblings:
            attempt = sibling.attempts[-1]
            if attempt.status is sealed:
                owned = attempt.staging_keys
            elif attempt.status in _IN_FLIGHT:
                owned = attempt.turn_keys  # the committed turns restore continues from
            else:
                continue
            if all(map(held, owned)):  # in C: 16k siblings per restore, rows mostly there
                continue
            missing = [key for key in owned if key not in staging]
            problems.append(
                SnapshotProblem(
                    ProblemKind.MISSING_ROWS,
                    snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME,
                    f"group {group.group_id!r} sibling {sibling.generation_index} "
                    f"names staged rows {missing} that data_plane/ does not hold",
                    partition=STAGING_PARTITION,
                    keys=tuple(sorted(missing)),
                )
            )
    return problems


def _env_rollout_problems(snapshot: LoadedSnapshot) -> list[SnapshotProblem]:
    """The environment-state sidecar against the ledger, both directions.

    Each episode it holds belongs to a live current attempt whose committed
    turns are at its revision, and a restorable one carries its state; each
    live attempt with committed turns has its episode there (else restore
    restarts that episode from its first turn).
    """
    path = snapshot.path / ENV_ROLLOUTS_FILENAME
    episodes = dict(snapshot.env_rollouts.episodes)
    problems = []
    for group in snapshot.recovery.ledger_groups():
        for sibling in group.siblings:
            attempt = sibling.attempts[-1]
            logical = f"{group.group_id}_g{sibling.generation_index}"
            entry = episodes.pop(logical, None)
            live = attempt.status in _IN_FLIGHT and attempt.turn_keys
            if not live:
                if entry is not None:
                    problems.append(
                        _env_problem(path, f"{logical}: no live attempt owns its state")
                    )
                continue
            if entry is None:
                problems.append(
                    _env_problem(
                        path,
                        f"{logical}: {len(attempt.turn_keys)} committed turns in "
                        f"{ROLLOUT_RECOVERY_STATE_FILENAME} but no environment state",
                    )
                )
            elif entry.env_state_revision != attempt.env_state_revision:
                problems.append(
                    _env_problem(
                        path,
                        f"{logical}: environment state at revision {entry.env_state_revision}, "
                        f"the ledger's committed turns at {attempt.env_state_revision}",
                    )
                )
            elif entry.restore_class is RestoreClass.RESTORABLE and entry.env_state is None:
                problems.append(_env_problem(path, f"{logical}: restorable but no env_state"))
    problems += [
        _env_problem(path, f"{logical}: no such sibling in {ROLLOUT_RECOVERY_STATE_FILENAME}")
        for logical in sorted(episodes)
    ]
    return problems


def _env_problem(path: Path, message: str) -> SnapshotProblem:
    return SnapshotProblem(ProblemKind.INCONSISTENT, path, message)


def _canonical_rows(snapshot: LoadedSnapshot, generations_per_group: int | None) -> set[str]:
    """The train rows the replay index references: one per attempt each canonical group lists.

    A group that lists no attempts (already a problem) is taken at the run's size.
    """
    attempts = snapshot.replay.canonical_attempts
    return {
        train_key(entry.group_id, index)
        for entry in snapshot.replay.replay.entries
        for index in range(
            len(attempts[entry.group_id])
            if entry.group_id in attempts
            else generations_per_group or 0
        )
    }


def _canonical_group_problems(
    snapshot: LoadedSnapshot, generations_per_group: int | None
) -> list[SnapshotProblem]:
    path = snapshot.path / REPLAY_BUFFER_METADATA_FILENAME
    problems = [
        SnapshotProblem(
            ProblemKind.INCONSISTENT,
            _facts_file(snapshot, REPLAY_BUFFER_METADATA_FILENAME),
            f"canonical group {entry.group_id!r} lists no attempts",
        )
        for entry in snapshot.replay.replay.entries
        if entry.group_id not in snapshot.replay.canonical_attempts
    ]
    train = snapshot.data_plane.partitions.get(TRAIN_PARTITION, {})
    missing = sorted(_canonical_rows(snapshot, generations_per_group).difference(train))
    if missing:
        problems.append(
            SnapshotProblem(
                ProblemKind.MISSING_ROWS,
                path,
                f"names {len(missing)} canonical rows data_plane/ does not hold: {_some(missing)}",
                partition=TRAIN_PARTITION,
                keys=tuple(missing),
            )
        )
    return problems


def _orphan_staged_rows(
    snapshot: LoadedSnapshot, ledger: RolloutRecoveryLedger, *, in_flight_expected: bool
) -> list[SnapshotProblem]:
    """A staged row must belong to a sealed current attempt of a ledger group, or
    (unless the run finished) to a current attempt still in flight: the gate
    writes its rows before the attempt is sealed, and restore drops them."""
    staged = snapshot.data_plane.partitions.get(STAGING_PARTITION, {})
    sealed = ledger.expected_staging_keys()
    in_flight = {
        record.gate_rollout_id(sibling.generation_index)
        for record in ledger.groups()
        for sibling in record.siblings
        if in_flight_expected and sibling.current_attempt.status in _IN_FLIGHT
    }
    orphans = [key for key in staged if key not in sealed and _staged_by(key) not in in_flight]
    owners = "sealed or in-flight" if in_flight_expected else "sealed"
    why = f"referenced by no {owners} current attempt in {ROLLOUT_RECOVERY_STATE_FILENAME}"
    return _orphan_problem(snapshot, STAGING_PARTITION, orphans, why)


def _staged_by(key: str) -> str | None:
    try:
        return parse_staging_key(key).gate_rollout_id
    except DataPlaneValidationError:
        return None  # not a staging key at all: it cannot be any attempt's row


def _orphan_train_rows(
    snapshot: LoadedSnapshot,
    ledger: RolloutRecoveryLedger,
    generations_per_group: int | None,
    *,
    finalizing_expected: bool,
) -> list[SnapshotProblem]:
    """A train row must be a canonical row of a replay-index group or (unless
    the run finished) of a ledger group caught mid-finalization."""
    train = snapshot.data_plane.partitions.get(TRAIN_PARTITION, {})
    required = _canonical_rows(snapshot, generations_per_group)
    tolerated = {
        train_key(record.group_id, index)
        for record in ledger.groups()
        if finalizing_expected and record.status in _MAY_HOLD_CANONICAL_ROWS
        for index in range(record.expected_generations)
    }
    orphans = [key for key in train if key not in required and key not in tolerated]
    why = "belonging to no group of the replay index"
    return _orphan_problem(snapshot, TRAIN_PARTITION, orphans, why)


def _orphan_problem(
    snapshot: LoadedSnapshot, partition: str, keys: list[str], why: str
) -> list[SnapshotProblem]:
    if not keys:
        return []
    # A segmented snapshot lists its rows in the data plane's index, not in a file per partition.
    name = METADATA_FILENAME if snapshot.segments is not None else partition_file_name(partition)
    path = snapshot.path / DATA_PLANE_DIRNAME / name
    keys = sorted(keys)
    message = f"{len(keys)} orphan {partition} rows, {why}: {_some(keys)}"
    return [
        SnapshotProblem(
            ProblemKind.ORPHAN_ROWS, path, message, partition=partition, keys=tuple(keys)
        )
    ]


def _unfinished_work(snapshot: LoadedSnapshot) -> list[SnapshotProblem]:
    """No group may be left in the ledger, and the replay index may hold only the
    groups trained since the last trainer checkpoint (kept for a rollback)."""
    problems = []
    groups = len(snapshot.recovery.ledger_groups())
    if groups:
        problems.append(
            SnapshotProblem(
                ProblemKind.UNFINISHED,
                snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME,
                f"{groups} groups are still in the ledger, unfinished",
            )
        )
    entries = snapshot.replay.replay.entries
    untrained = len(entries) - snapshot.manifest.rolled_back_train_group_count
    if untrained:
        problems.append(
            SnapshotProblem(
                ProblemKind.UNFINISHED,
                snapshot.path / REPLAY_BUFFER_METADATA_FILENAME,
                f"{untrained} finalized groups were never trained",
            )
        )
    return problems


def _some(keys: Iterable[str]) -> str:
    keys = list(keys)
    shown = ", ".join(repr(key) for key in keys[:_SHOWN_KEYS])
    more = len(keys) - _SHOWN_KEYS
    return f"{shown} and {more} more" if more > 0 else shown
