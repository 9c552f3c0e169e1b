"""Filesystem contract for frequent Single Controller rollout snapshots.

Spec-facing names of :mod:`rollvault.durable` (spec page
``rollout_checkpointing_manifest.md``). On disk::

    <checkpoint_dir>/bootstrap/manifest.json          compatibility identity + fingerprint
    <anchor>/rollout_snapshots/tmp_snapshot_<seq>/    being written; never read
    <anchor>/rollout_snapshots/snapshot_<seq>/        committed, with manifest.json
    <anchor>/rollout_snapshots/trash_snapshot_<seq>/  pruned; deleted after the rename

where ``<anchor>`` is ``<checkpoint_dir>/bootstrap`` before the first trainer
checkpoint and ``<checkpoint_dir>/step_<N>`` after it. Writing a snapshot::

    tmp, final, seq = prepare_snapshot_paths(anchor)
    ...write the files into tmp, then its manifest.json...
    commit_snapshot(tmp, final, keep_latest_k=3)

(:func:`publish_snapshot` does the three steps and cleans up on failure.)
A crash at any step leaves the previous committed snapshot or the new one.
Restart calls :func:`resolve_latest_snapshot`. Every failure is a
:class:`SnapshotError`.
"""

# The spec page also documents private helpers; they are re-exported with
# redundant aliases (importable, not in __all__).
from rollvault.durable.bootstrap import (
    _bootstrap_anchor_manifest as _bootstrap_anchor_manifest,
)
from rollvault.durable.bootstrap import (
    ensure_bootstrap_anchor,
    prune_bootstrap_snapshots,
    validate_bootstrap_anchor,
)
from rollvault.durable.compatibility import (
    _BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS as _BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS,
)
from rollvault.durable.compatibility import (
    _MISSING as _MISSING,
)
from rollvault.durable.compatibility import (
    BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION,
    BootstrapCompatibilityIdentity,
    bootstrap_compatibility_identity,
)
from rollvault.durable.compatibility import (
    _compatibility_differences as _compatibility_differences,
)
from rollvault.durable.compatibility import (
    _format_changed_value as _format_changed_value,
)
from rollvault.durable.compatibility import (
    _normalize_capture_reward_config as _normalize_capture_reward_config,
)
from rollvault.durable.config_paths import _drop_excluded_paths as _drop_excluded_paths
from rollvault.durable.config_paths import _path_matches as _path_matches
from rollvault.durable.errors import (
    IncompatibleRunError,
    NoUsableSnapshotError,
    SnapshotError,
    SnapshotLayoutError,
    SnapshotManifestError,
    SnapshotWriteError,
)
from rollvault.durable.fsync import _fsync_directory as _fsync_directory
from rollvault.durable.fsync import _fsync_file as _fsync_file
from rollvault.durable.fsync import _fsync_tree as _fsync_tree
from rollvault.durable.fsync import atomic_write_bytes
from rollvault.durable.layout import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    ROLLOUT_SNAPSHOT_MANIFEST_FILENAME,
    ROLLOUT_SNAPSHOTS_DIRNAME,
)
from rollvault.durable.manifest_schema import (
    ROLLOUT_SNAPSHOT_SCHEMA_VERSION,
    ResolvedRolloutCheckpoint,
    RolloutSnapshotManifest,
    read_snapshot_manifest,
    write_snapshot_manifest,
)
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.resolve import SnapshotVerifier, resolve_latest_snapshot
from rollvault.durable.snapshot_dirs import (
    _SNAPSHOT_RE as _SNAPSHOT_RE,
)
from rollvault.durable.snapshot_dirs import (
    _TMP_SNAPSHOT_RE as _TMP_SNAPSHOT_RE,
)
from rollvault.durable.snapshot_dirs import (
    _TRASH_SNAPSHOT_RE as _TRASH_SNAPSHOT_RE,
)
from rollvault.durable.snapshot_dirs import (
    _snapshot_sequence as _snapshot_sequence,
)
from rollvault.durable.snapshot_dirs import (
    abort_snapshot,
    commit_snapshot,
    prepare_snapshot_paths,
)

__all__ = [
    "BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION",
    "BOOTSTRAP_DIRNAME",
    "BOOTSTRAP_MANIFEST_FILENAME",
    "ROLLOUT_SNAPSHOTS_DIRNAME",
    "ROLLOUT_SNAPSHOT_MANIFEST_FILENAME",
    "ROLLOUT_SNAPSHOT_SCHEMA_VERSION",
    "BootstrapCompatibilityIdentity",
    "IncompatibleRunError",
    "NoUsableSnapshotError",
    "ResolvedRolloutCheckpoint",
    "RolloutSnapshotManifest",
    "SnapshotError",
    "SnapshotLayoutError",
    "SnapshotManifestError",
    "SnapshotVerifier",
    "SnapshotWriteError",
    "abort_snapshot",
    "atomic_write_bytes",
    "bootstrap_compatibility_identity",
    "commit_snapshot",
    "ensure_bootstrap_anchor",
    "prepare_snapshot_paths",
    "prune_bootstrap_snapshots",
    "publish_snapshot",
    "read_snapshot_manifest",
    "resolve_latest_snapshot",
    "validate_bootstrap_anchor",
    "write_snapshot_manifest",
]
