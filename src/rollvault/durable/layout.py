"""Names of the directories and files of a checkpoint directory.

::

    <checkpoint_dir>/
      bootstrap/manifest.json            BOOTSTRAP_DIRNAME / BOOTSTRAP_MANIFEST_FILENAME
      bootstrap/dataset_identity.json    DATASET_IDENTITY_FILENAME: the dataset's row digests
      bootstrap/rollout_snapshots/       snapshots before the first trainer checkpoint
      bootstrap/policy/                  BOOTSTRAP_POLICY_DIRNAME: the version-0 policy
      final_model/                       FINAL_MODEL_DIRNAME: the policy when the run finished
      step_<N>/rollout_snapshots/        ROLLOUT_SNAPSHOTS_DIRNAME under a trainer checkpoint
         tmp_snapshot_<seq>/             being written, never read
         snapshot_<seq>/manifest.json    committed; ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
         trash_snapshot_<seq>/           pruned, deleted after the rename
         segments/                       SEGMENTS_DIRNAME: token rows shared by the snapshots
      step_<N>/rollout_state/segments/   the trainer checkpoint's snapshot keeps its own

An *anchor* is the directory that owns a ``rollout_snapshots/`` directory:
``bootstrap/`` or a trainer checkpoint ``step_<N>/``.
"""

from typing import Final

BOOTSTRAP_DIRNAME: Final = "bootstrap"
BOOTSTRAP_MANIFEST_FILENAME: Final = "manifest.json"
ROLLOUT_SNAPSHOTS_DIRNAME: Final = "rollout_snapshots"
ROLLOUT_SNAPSHOT_MANIFEST_FILENAME: Final = "manifest.json"
# Immutable token-row files written once and referenced by every snapshot that
# holds their rows (rollvault.dataplane.segments); beside the snapshots of an
# anchor, and inside a snapshot that is not among them (a trainer checkpoint's).
SEGMENTS_DIRNAME: Final = "segments"

# The identity digest of every dataset row when the run started, written with
# the anchor (before its manifest); every resume compares the dataset against it.
DATASET_IDENTITY_FILENAME: Final = "dataset_identity.json"

# Where prune_bootstrap_snapshots parks the bootstrap snapshots between its
# rename and its delete (rollvault.durable.retention.trash_name of
# ROLLOUT_SNAPSHOTS_DIRNAME); never read, removed by the next prune.
BOOTSTRAP_TRASH_DIRNAME: Final = "trash_rollout_snapshots"

# Hugging Face model directories (published whole by durable.published_dirs):
# the policy the run generated its first rollouts with, saved once after the
# warm-up, and the policy as the run finished.
BOOTSTRAP_POLICY_DIRNAME: Final = "policy"
FINAL_MODEL_DIRNAME: Final = "final_model"
