"""What the segment crash children (rows, ledger records, group facts) share.

Each child commits snapshot after snapshot of the bootstrap anchor, one step
each, keeping the newest :data:`KEEP_LATEST_K`; the step is the manifest's
sampler dispatch index, which is how ``verify`` finds it again.
"""

from __future__ import annotations

from pathlib import Path

from rollvault.durable.manifest_schema import RolloutSnapshotManifest

KEEP_LATEST_K = 2


def manifest_for(step: int) -> RolloutSnapshotManifest:
    """The manifest of the snapshot the child commits at ``step``."""
    return RolloutSnapshotManifest(
        schema_version=3,
        base_train_step=0,
        trainer_version=0,
        current_epoch=0,
        sampler_dispatch_index=step,
        mutation_version=step,
        rolled_back_train_group_count=0,
        bootstrap_fingerprint=None,
        next_nemo_gym_task_index=None,
    )


def files_in(segments_dir: Path) -> list[str]:
    """The names in ``segments_dir``, sorted (none before the first segment is written)."""
    return sorted(p.name for p in segments_dir.iterdir()) if segments_dir.is_dir() else []
