"""RolloutSnapshotManifest: strict decoding, exact round trip, file helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.errors import SnapshotManifestError
from rollvault.durable.manifest_schema import (
    ROLLOUT_SNAPSHOT_SCHEMA_VERSION,
    RolloutSnapshotManifest,
    encode_snapshot_manifest,
    read_snapshot_manifest,
    write_snapshot_manifest,
)

FINGERPRINT = "ab" * 32


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "schema_version": 3,
        "base_train_step": 4,
        "trainer_version": 4,
        "current_epoch": 1,
        "sampler_dispatch_index": 77,
        "mutation_version": 12,
        "rolled_back_train_group_count": 2,
        "bootstrap_fingerprint": FINGERPRINT,
        "next_nemo_gym_task_index": 5,
    }
    raw.update(changes)
    return raw


def test_schema_version_constant_is_the_spec_value() -> None:
    assert ROLLOUT_SNAPSHOT_SCHEMA_VERSION == 3


def test_round_trip_is_exact_including_nulls() -> None:
    for raw in (_raw(), _raw(bootstrap_fingerprint=None, next_nemo_gym_task_index=None)):
        manifest = RolloutSnapshotManifest.from_mapping(raw)
        assert manifest.to_dict() == raw
        assert list(manifest.to_dict()) == list(raw)
        assert RolloutSnapshotManifest.from_mapping(manifest.to_dict()) == manifest


def test_to_dict_returns_a_fresh_dict() -> None:
    manifest = RolloutSnapshotManifest.from_mapping(_raw())
    manifest.to_dict()["trainer_version"] = 99
    assert manifest.trainer_version == 4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_raw(extra=1), "Object contains unknown field `extra`"),
        (
            {k: v for k, v in _raw().items() if k != "mutation_version"},
            "missing required field `mutation_version`",
        ),
        (
            {k: v for k, v in _raw().items() if k != "next_nemo_gym_task_index"},
            "missing required field `next_nemo_gym_task_index`",
        ),
        (_raw(trainer_version="4"), "Expected `int`, got `str` - at `$.trainer_version`"),
        (_raw(current_epoch=True), "Expected `int`, got `bool` - at `$.current_epoch`"),
        (_raw(base_train_step=4.0), "Expected `int`, got `float` - at `$.base_train_step`"),
        (_raw(sampler_dispatch_index=-1), "Expected `int` >= 0 - at `$.sampler_dispatch_index`"),
        (
            _raw(rolled_back_train_group_count=None),
            "Expected `int`, got `null` - at `$.rolled_back_train_group_count`",
        ),
        (_raw(bootstrap_fingerprint="ABC"), "- at `$.bootstrap_fingerprint`"),
        (
            _raw(next_nemo_gym_task_index=-3),
            "Expected `int` >= 0 - at `$.next_nemo_gym_task_index`",
        ),
        (
            _raw(schema_version=2),
            "unsupported rollout snapshot schema version 2 - at `$.schema_version`",
        ),
        (_raw(schema_version=4, unknown=1), "unsupported rollout snapshot schema version 4"),
        (_raw(schema_version="3"), "Expected `int`, got `str` - at `$.schema_version`"),
    ],
)
def test_from_mapping_rejects_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SnapshotManifestError) as info:
        RolloutSnapshotManifest.from_mapping(raw)
    assert message in str(info.value)


def test_from_mapping_rejects_a_non_mapping() -> None:
    with pytest.raises(SnapshotManifestError, match="must be a JSON object, got list"):
        RolloutSnapshotManifest.from_mapping([1, 2])  # type: ignore[arg-type]


def test_constructing_an_unsupported_version_in_code_is_refused() -> None:
    with pytest.raises(
        SnapshotManifestError, match="unsupported rollout snapshot schema version 9"
    ):
        RolloutSnapshotManifest(**_raw(schema_version=9))


def test_encoding_refuses_an_invalid_manifest_built_in_code() -> None:
    manifest = RolloutSnapshotManifest(**_raw(current_epoch=-1))
    with pytest.raises(SnapshotManifestError, match=r"`\$.current_epoch`"):
        encode_snapshot_manifest(manifest)


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    manifest = RolloutSnapshotManifest.from_mapping(_raw())
    path = write_snapshot_manifest(tmp_path, manifest)
    assert path == tmp_path / "manifest.json"
    assert read_snapshot_manifest(tmp_path) == manifest


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "manifest.json: missing"),
        (b'{"schema_version": 3,', "manifest.json: not valid JSON"),
        (b"[]", "manifest.json: rollout snapshot manifest must be a JSON object"),
        (
            b'{"schema_version": 3}',
            "manifest.json: invalid rollout snapshot manifest: Object missing",
        ),
    ],
)
def test_read_errors_name_the_file(tmp_path: Path, content: bytes | None, message: str) -> None:
    if content is not None:
        (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(SnapshotManifestError) as info:
        read_snapshot_manifest(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert message in str(info.value)
