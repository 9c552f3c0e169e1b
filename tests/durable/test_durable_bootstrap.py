"""The bootstrap anchor: creation, validation, corruption and pruning."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.bootstrap import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    _bootstrap_anchor_manifest,
    ensure_bootstrap_anchor,
    holds_run,
    open_bootstrap_anchor,
    prune_bootstrap_snapshots,
    read_bootstrap_manifest,
    validate_bootstrap_anchor,
)
from rollvault.durable.compatibility import (
    BootstrapCompatibilityIdentity,
    bootstrap_compatibility_identity,
)
from rollvault.durable.errors import IncompatibleRunError, SnapshotManifestError

CONFIG = {"grpo": {"lr": 1e-6, "n": 4}, "api_key": "sk-1", "logger": {"dir": "/x"}}
IDENTITY = bootstrap_compatibility_identity(CONFIG)


def _manifest(anchor: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((anchor / BOOTSTRAP_MANIFEST_FILENAME).read_text())
    return loaded


def _rewrite(anchor: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = _manifest(anchor)
    change(manifest)
    (anchor / BOOTSTRAP_MANIFEST_FILENAME).write_text(json.dumps(manifest))


def test_constants_are_the_spec_values() -> None:
    assert (BOOTSTRAP_DIRNAME, BOOTSTRAP_MANIFEST_FILENAME) == ("bootstrap", "manifest.json")


def test_anchor_manifest_is_self_consistent() -> None:
    manifest = _bootstrap_anchor_manifest(IDENTITY)
    assert manifest == {**IDENTITY.to_dict(), "fingerprint": IDENTITY.fingerprint()}


def test_ensure_creates_the_anchor_in_a_fresh_directory(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path / "runs" / "ckpt", identity=IDENTITY)
    assert anchor == tmp_path / "runs" / "ckpt" / "bootstrap"
    assert _manifest(anchor) == _bootstrap_anchor_manifest(IDENTITY)
    assert sorted(p.name for p in anchor.iterdir()) == ["manifest.json"]


def test_open_returns_the_fingerprint_it_wrote(tmp_path: Path) -> None:
    opened = open_bootstrap_anchor(tmp_path, identity=IDENTITY)
    assert opened.fingerprint == IDENTITY.fingerprint() == _manifest(opened.path)["fingerprint"]
    assert open_bootstrap_anchor(tmp_path, identity=IDENTITY) == opened


def test_ensure_validates_an_existing_anchor_without_rewriting_it(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    before = (anchor / BOOTSTRAP_MANIFEST_FILENAME).stat().st_mtime_ns
    same_meaning = bootstrap_compatibility_identity({**CONFIG, "logger": {"dir": "/elsewhere"}})
    assert ensure_bootstrap_anchor(tmp_path, identity=same_meaning) == anchor
    assert (anchor / BOOTSTRAP_MANIFEST_FILENAME).stat().st_mtime_ns == before


def test_mismatch_lists_every_changed_leaf_with_secrets_redacted(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    changed = bootstrap_compatibility_identity(
        {"grpo": {"lr": 2e-6, "n": 4, "extra": [1]}, "api_key": "sk-2"}
    )
    with pytest.raises(IncompatibleRunError) as info:
        validate_bootstrap_anchor(anchor, identity=changed)
    assert info.value.differences == [
        "api_key: <redacted> -> <redacted>",
        "grpo.extra: <missing> -> [1]",
        "grpo.lr: 1e-06 -> 2e-06",
    ]
    assert "sk-1" not in str(info.value) and "sk-2" not in str(info.value)
    assert info.value.anchor == anchor


def test_validate_does_not_write(tmp_path: Path) -> None:
    anchor = tmp_path / "bootstrap"
    anchor.mkdir()
    with pytest.raises(
        SnapshotManifestError, match="manifest.json: missing; not a bootstrap anchor"
    ):
        validate_bootstrap_anchor(anchor, identity=IDENTITY)
    assert list(anchor.iterdir()) == []


def test_a_changed_exclusion_list_is_named(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    other = BootstrapCompatibilityIdentity(
        schema_version=7, excluded_paths=("logger",), config=IDENTITY.config
    )
    with pytest.raises(IncompatibleRunError) as info:
        validate_bootstrap_anchor(anchor, identity=other)
    [line] = info.value.differences
    assert line.startswith("excluded operational paths: [") and line.endswith('-> ["logger"]')


def test_an_anchor_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    _rewrite(anchor, lambda m: m.update(schema_version=6))
    with pytest.raises(
        IncompatibleRunError, match="bootstrap compatibility schema version: 6 -> 7"
    ):
        validate_bootstrap_anchor(anchor, identity=IDENTITY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: m.update(config={"grpo": {"lr": 5.0}}),
            "corrupt: its fingerprint does not match",
        ),
        (lambda m: m.update(extra=1), "unknown field `extra`"),
        (lambda m: m.pop("fingerprint"), "missing required field `fingerprint`"),
        (lambda m: m.update(fingerprint="zz"), "- at `$.fingerprint`"),
        (lambda m: m.update(config=[1]), "Expected `object`, got `array` - at `$.config`"),
        (lambda m: m.update(excluded_paths="logger"), "- at `$.excluded_paths`"),
    ],
)
def test_a_corrupt_anchor_is_refused_naming_the_problem(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    _rewrite(anchor, change)
    with pytest.raises(SnapshotManifestError) as info:
        ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    assert str(anchor / "manifest.json") in str(info.value)
    assert message in str(info.value)


def test_the_reader_returns_the_stored_identity_and_says_whether_it_is_intact(
    tmp_path: Path,
) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    stored = read_bootstrap_manifest(anchor)
    assert stored.fingerprint == IDENTITY.fingerprint() == _manifest(anchor)["fingerprint"]
    assert stored.stored_identity() == IDENTITY
    assert stored.fingerprint_matches_identity()
    _rewrite(anchor, lambda m: m.update(config={"grpo": {"lr": 5.0}}))
    tampered = read_bootstrap_manifest(anchor)  # reading judges the schema, not the digest
    assert tampered.config == {"grpo": {"lr": 5.0}}
    assert not tampered.fingerprint_matches_identity()
    _rewrite(anchor, lambda m: m.update(extra=1))
    with pytest.raises(SnapshotManifestError, match="unknown field `extra`"):
        read_bootstrap_manifest(anchor)


def test_an_anchor_that_is_not_json_is_refused(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    (anchor / BOOTSTRAP_MANIFEST_FILENAME).write_bytes(b"\x00garbage")
    with pytest.raises(SnapshotManifestError, match="manifest.json: not valid JSON"):
        validate_bootstrap_anchor(anchor, identity=IDENTITY)


def test_a_run_is_a_committed_anchor_or_a_trainer_checkpoint(tmp_path: Path) -> None:
    assert not holds_run(tmp_path / "absent")
    assert not holds_run(tmp_path)
    (tmp_path / BOOTSTRAP_DIRNAME).mkdir()  # a first start killed before its manifest
    assert not holds_run(tmp_path)
    ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    assert holds_run(tmp_path)
    lost = tmp_path / "lost"
    (lost / "step_4").mkdir(parents=True)  # the anchor is gone, the trainer checkpoint is not
    assert holds_run(lost)
    (lost / "step_4").rmdir()
    (lost / "tmp_step_4").mkdir()  # never committed
    assert not holds_run(lost)


def _with_snapshots(tmp_path: Path) -> Path:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    (anchor / "rollout_snapshots" / "snapshot_000001").mkdir(parents=True)
    (anchor / "rollout_snapshots" / "snapshot_000001" / "manifest.json").write_text("{}")
    return anchor


def test_prune_needs_an_existing_trainer_checkpoint(tmp_path: Path) -> None:
    anchor = _with_snapshots(tmp_path)
    assert (
        prune_bootstrap_snapshots(tmp_path, durable_trainer_checkpoint=tmp_path / "step_1") is False
    )
    assert (anchor / "rollout_snapshots" / "snapshot_000001").is_dir()


def test_prune_removes_the_snapshots_and_keeps_the_anchor(tmp_path: Path) -> None:
    anchor = _with_snapshots(tmp_path)
    (tmp_path / "step_1").mkdir()
    assert (
        prune_bootstrap_snapshots(tmp_path, durable_trainer_checkpoint=tmp_path / "step_1") is True
    )
    assert sorted(p.name for p in anchor.iterdir()) == ["manifest.json"]
    validate_bootstrap_anchor(anchor, identity=IDENTITY)
    assert (
        prune_bootstrap_snapshots(tmp_path, durable_trainer_checkpoint=tmp_path / "step_1") is False
    )


def test_prune_finishes_the_trash_of_an_interrupted_prune(tmp_path: Path) -> None:
    anchor = ensure_bootstrap_anchor(tmp_path, identity=IDENTITY)
    (anchor / "trash_rollout_snapshots" / "snapshot_000001").mkdir(parents=True)
    (tmp_path / "step_1").mkdir()
    assert (
        prune_bootstrap_snapshots(tmp_path, durable_trainer_checkpoint=tmp_path / "step_1") is True
    )
    assert sorted(p.name for p in anchor.iterdir()) == ["manifest.json"]


def test_prune_refuses_a_trainer_checkpoint_inside_the_anchor(tmp_path: Path) -> None:
    anchor = _with_snapshots(tmp_path)
    with pytest.raises(ValueError, match="is inside the bootstrap anchor"):
        prune_bootstrap_snapshots(tmp_path, durable_trainer_checkpoint=anchor / "rollout_snapshots")
    assert (anchor / "rollout_snapshots").is_dir()
