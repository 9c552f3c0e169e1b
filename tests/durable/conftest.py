"""Shared fixtures of the durable-layer tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.manifest_schema import RolloutSnapshotManifest, write_snapshot_manifest
from rollvault.durable.snapshot_dirs import commit_snapshot, prepare_snapshot_paths

MakeManifest = Callable[..., RolloutSnapshotManifest]
CommitOne = Callable[..., Path]


@pytest.fixture
def make_manifest() -> MakeManifest:
    def make(**changes: Any) -> RolloutSnapshotManifest:
        fields: dict[str, Any] = {
            "schema_version": 3,
            "base_train_step": 0,
            "trainer_version": 0,
            "current_epoch": 0,
            "sampler_dispatch_index": 0,
            "mutation_version": 0,
            "rolled_back_train_group_count": 0,
            "bootstrap_fingerprint": None,
            "next_nemo_gym_task_index": None,
        }
        fields.update(changes)
        return RolloutSnapshotManifest(**fields)

    return make


@pytest.fixture
def anchor(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt" / "bootstrap"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def commit_one(make_manifest: MakeManifest) -> CommitOne:
    """Commit a snapshot whose mutation_version is its sequence and payload.bin names it."""

    def commit(anchor: Path, *, keep_latest_k: int = 3, **changes: Any) -> Path:
        tmp_path, final_path, sequence = prepare_snapshot_paths(anchor)
        (tmp_path / "payload.bin").write_bytes(f"payload {sequence}".encode())
        write_snapshot_manifest(tmp_path, make_manifest(mutation_version=sequence, **changes))
        commit_snapshot(tmp_path, final_path, keep_latest_k=keep_latest_k)
        return final_path

    return commit
