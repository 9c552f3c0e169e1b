"""resolve_latest_snapshot: newest usable first, fallbacks logged, clear refusal."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.errors import NoUsableSnapshotError, SnapshotError
from rollvault.durable.manifest_schema import (
    ResolvedRolloutCheckpoint,
    RolloutSnapshotManifest,
    write_snapshot_manifest,
)
from rollvault.durable.resolve import SnapshotVerifier, resolve_latest_snapshot

CommitOne = Callable[..., Path]
FP = "cd" * 32


def _resolve(
    anchor: Path,
    *,
    expected_train_step: int = 0,
    expected_trainer_version: int = 0,
    expected_bootstrap_fingerprint: str | None = FP,
    verify_snapshot: SnapshotVerifier | None = None,
) -> ResolvedRolloutCheckpoint | None:
    """resolve_latest_snapshot expecting what commit_one writes unless told otherwise."""
    return resolve_latest_snapshot(
        anchor,
        expected_train_step=expected_train_step,
        expected_trainer_version=expected_trainer_version,
        expected_bootstrap_fingerprint=expected_bootstrap_fingerprint,
        verify_snapshot=verify_snapshot,
    )


def test_nothing_to_resolve_returns_none(anchor: Path) -> None:
    assert _resolve(anchor) is None
    (anchor / "rollout_snapshots").mkdir()
    (anchor / "rollout_snapshots" / "tmp_snapshot_000001").mkdir()
    (anchor / "rollout_snapshots" / "trash_snapshot_000002").mkdir()
    assert _resolve(anchor) is None


def test_the_newest_matching_snapshot_is_chosen(anchor: Path, commit_one: CommitOne) -> None:
    for _ in range(3):
        commit_one(anchor, bootstrap_fingerprint=FP)
    resolved = _resolve(anchor)
    assert resolved is not None
    assert resolved.path.name == "snapshot_000003"
    assert resolved.manifest.mutation_version == 3


def test_tmp_and_trash_directories_are_never_read(
    anchor: Path, commit_one: CommitOne, make_manifest: Callable[..., RolloutSnapshotManifest]
) -> None:
    commit_one(anchor, bootstrap_fingerprint=FP)
    root = anchor / "rollout_snapshots"
    for name in ("tmp_snapshot_000009", "trash_snapshot_000008"):
        (root / name).mkdir()
        write_snapshot_manifest(
            root / name, make_manifest(bootstrap_fingerprint=FP, mutation_version=99)
        )
    resolved = _resolve(anchor)
    assert resolved is not None
    assert resolved.path.name == "snapshot_000001"


def test_corrupt_snapshots_are_skipped_with_a_warning(
    anchor: Path, commit_one: CommitOne, caplog: pytest.LogCaptureFixture
) -> None:
    good = commit_one(anchor, bootstrap_fingerprint=FP)
    truncated = commit_one(anchor, bootstrap_fingerprint=FP)
    (truncated / "manifest.json").write_bytes((truncated / "manifest.json").read_bytes()[:20])
    missing = commit_one(anchor, bootstrap_fingerprint=FP)
    (missing / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="rollvault.durable"):
        resolved = _resolve(anchor)
    assert resolved is not None
    assert resolved.path == good
    warnings = [r.getMessage() for r in caplog.records if r.name == "rollvault.durable"]
    assert len(warnings) == 2
    assert (
        warnings[0].startswith(f"skipping rollout snapshot {missing}: ")
        and "missing" in warnings[0]
    )
    assert warnings[1].startswith(f"skipping rollout snapshot {truncated}: ")
    assert "not valid JSON" in warnings[1]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"expected_train_step": 5}, "base_train_step is 0, expected 5"),
        ({"expected_trainer_version": 2}, "trainer_version is 0, expected 2"),
        (
            {"expected_bootstrap_fingerprint": None},
            f"bootstrap_fingerprint is '{FP}', expected None",
        ),
    ],
)
def test_incompatible_snapshots_are_rejected_naming_the_field(
    anchor: Path, commit_one: CommitOne, overrides: dict[str, Any], reason: str
) -> None:
    only = commit_one(anchor, bootstrap_fingerprint=FP)
    with pytest.raises(NoUsableSnapshotError) as info:
        _resolve(anchor, **overrides)
    assert info.value.rejected == [(only, f"incompatible manifest: {reason}")]


def test_an_older_compatible_snapshot_is_used_when_the_newest_is_not(
    anchor: Path, commit_one: CommitOne
) -> None:
    older = commit_one(anchor, base_train_step=4, trainer_version=4, bootstrap_fingerprint=None)
    commit_one(anchor, base_train_step=5, trainer_version=5, bootstrap_fingerprint=None)
    resolved = _resolve(
        anchor,
        expected_train_step=4,
        expected_trainer_version=4,
        expected_bootstrap_fingerprint=None,
    )
    assert resolved is not None
    assert resolved.path == older


def test_verifier_rejections_fall_back_to_an_older_snapshot(
    anchor: Path, commit_one: CommitOne
) -> None:
    older = commit_one(anchor, bootstrap_fingerprint=FP)
    newer = commit_one(anchor, bootstrap_fingerprint=FP)
    seen: list[tuple[Path, int]] = []

    def verify(path: Path, manifest: RolloutSnapshotManifest) -> None:
        seen.append((path, manifest.mutation_version))
        if path == newer:
            raise SnapshotError("data_plane/metadata.json: checksum mismatch")

    resolved = _resolve(anchor, verify_snapshot=verify)
    assert resolved is not None
    assert resolved.path == older
    assert seen == [(newer, 2), (older, 1)]


def test_a_missing_file_reported_by_the_verifier_is_a_rejection(
    anchor: Path, commit_one: CommitOne
) -> None:
    only = commit_one(anchor, bootstrap_fingerprint=FP)

    def verify(path: Path, manifest: RolloutSnapshotManifest) -> None:
        (path / "rollout_recovery.json").read_bytes()

    with pytest.raises(NoUsableSnapshotError) as info:
        _resolve(anchor, verify_snapshot=verify)
    [(path, reason)] = info.value.rejected
    assert (
        path == only
        and reason.startswith("FileNotFoundError: ")
        and "rollout_recovery.json" in reason
    )


def test_verifier_bugs_propagate(anchor: Path, commit_one: CommitOne) -> None:
    commit_one(anchor, bootstrap_fingerprint=FP)

    def verify(path: Path, manifest: RolloutSnapshotManifest) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError, match="bug"):
        _resolve(anchor, verify_snapshot=verify)


def test_refusal_lists_every_rejected_snapshot_newest_first(
    anchor: Path, commit_one: CommitOne
) -> None:
    first = commit_one(anchor, bootstrap_fingerprint=None)
    second = commit_one(anchor, bootstrap_fingerprint=FP)
    (second / "manifest.json").write_text('{"schema_version": 2}')
    not_a_dir = anchor / "rollout_snapshots" / "snapshot_000007"
    not_a_dir.write_text("file")
    with pytest.raises(NoUsableSnapshotError) as info:
        _resolve(anchor)
    assert [path for path, _ in info.value.rejected] == [not_a_dir, second, first]
    message = str(info.value)
    assert (
        f"no usable rollout snapshot under {anchor}: all 3 committed snapshot(s) were rejected"
        in message
    )
    assert f"{not_a_dir}: not a directory" in message
    assert "unsupported rollout snapshot schema version 2" in message
    assert f"{first}: incompatible manifest: bootstrap_fingerprint is None" in message
