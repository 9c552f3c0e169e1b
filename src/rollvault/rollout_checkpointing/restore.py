"""Restore the rollout parts of a resumed checkpoint (spec-facing names).

Restores the replay index (``replay_buffer_metadata.json``), the recovery
ledger (``rollout_recovery.json``) and the spare-prompt pool
(``replacement_reserve.json``); the data-plane rows are loaded first. Runs
once before the pumps start; the rollout pump then redispatches what it
loaded. rollvault's files are JSON and safetensors where the reference system
writes ``.pt`` pickles: loading a checkpoint never runs code from it.

The implementation lives in :mod:`rollvault.controller.snapshots.restorer` (and
:mod:`rollvault.controller.snapshots.resume` for choosing what to restore from).
"""

from rollvault.controller.snapshots.restorer import (
    RestoreCounts,
    RestoreError,
    RolloutRestorer,
    read_recovery_sidecar,
)
from rollvault.controller.snapshots.resume import (
    ResumeSource,
    RunExistsError,
    prepare_checkpoint_dir,
)

__all__ = [
    "RestoreCounts",
    "RestoreError",
    "ResumeSource",
    "RolloutRestorer",
    "RunExistsError",
    "prepare_checkpoint_dir",
    "read_recovery_sidecar",
]
