"""Controller-owned lineage for recoverable token-capture prompt groups.

The spec-facing façade of :mod:`rollvault.ledger`: every name of the
reference API page (``nemo_rl.experience.rollout_recovery``) is importable
from here, with the same fields, values and signatures, plus the types that
page imports from elsewhere (``DatumSpec``, the ``reward_penalties`` records,
``DataPlaneMutationCut``) and rollvault's additions (the sidecar's JSON
encoding, the ledger's errors, ``RolloutRecoveryLedger.mark_sibling_failed``,
failure kinds and the interrupted attempts a restore records).

The ledger deliberately contains control-plane metadata only. Token rows stay
in the data plane. The versioned ``state_dict`` boundary is what the controller
writes into ``rollout_recovery.json`` at each snapshot and reads back on
restore; it is JSON, never pickle (see ``ROLLOUT_RECOVERY_STATE_FILENAME``).

The private helpers and ``_*_STATE_FIELDS`` sets that the reference page lists
are importable from here too (``import x as x``: explicit re-exports), but are
not part of ``__all__``.
"""

from rollvault.cut import DataPlaneMutationCut, MutationCutNotHeldError
from rollvault.ledger.datum import DatumSpec
from rollvault.ledger.errors import (
    CheckpointUnsafeError,
    DuplicateGroupError,
    ForeignCutError,
    InvalidLedgerInputError,
    InvalidReceiptError,
    LedgerError,
    LedgerStateError,
    LedgerTransitionError,
    PromptIdentityError,
    PromptPayloadUnboundError,
    SealConflictError,
    StaleAttemptError,
    UnknownGroupError,
    UnsupportedSchemaVersionError,
)
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.prompt_identity import _validate_prompt_identity as _validate_prompt_identity
from rollvault.ledger.receipts import (
    GateReceipt,
    StagedRowDigest,
)
from rollvault.ledger.receipts import (
    _receipt_staging_keys as _receipt_staging_keys,
)
from rollvault.ledger.records import (
    InterruptedAttempt,
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
    SiblingSealResult,
)
from rollvault.ledger.records import (
    _new_attempt as _new_attempt,
)
from rollvault.ledger.reward_penalties import (
    CaptureRewardSettings,
    FinalizedReward,
    RewardChecks,
    RewardLogContext,
)
from rollvault.ledger.sidecar import (
    ROLLOUT_RECOVERY_STATE_FILENAME,
    ParsedRolloutRecoveryState,
    build_rollout_recovery_state,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
    parse_rollout_recovery_state,
)
from rollvault.ledger.sidecar import (
    _validate_batch_shortfall as _validate_batch_shortfall,
)
from rollvault.ledger.sidecar import (
    _validate_finalizer_metrics as _validate_finalizer_metrics,
)
from rollvault.ledger.sidecar import (
    _validate_finalizer_rewards as _validate_finalizer_rewards,
)
from rollvault.ledger.state_schema import (
    _ATTEMPT_STATE_FIELDS as _ATTEMPT_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    _GROUP_STATE_FIELDS as _GROUP_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    _LEDGER_STATE_FIELDS as _LEDGER_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    _PROMPT_REF_STATE_FIELDS as _PROMPT_REF_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    _SIBLING_STATE_FIELDS as _SIBLING_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    _SIDECAR_STATE_FIELDS as _SIDECAR_STATE_FIELDS,
)
from rollvault.ledger.state_schema import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    RolloutRecoveryState,
)
from rollvault.ledger.state_schema import (
    _reject_unknown_fields as _reject_unknown_fields,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

__all__ = [
    "ROLLOUT_RECOVERY_SCHEMA_VERSION",
    "ROLLOUT_RECOVERY_STATE_FILENAME",
    "SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS",
    "AttemptFailureKind",
    "CaptureRewardSettings",
    "CheckpointUnsafeError",
    "DataPlaneMutationCut",
    "DatumSpec",
    "DuplicateGroupError",
    "FinalizedReward",
    "ForeignCutError",
    "GateReceipt",
    "InterruptedAttempt",
    "InvalidLedgerInputError",
    "InvalidReceiptError",
    "LedgerError",
    "LedgerStateError",
    "LedgerTransitionError",
    "MutationCutNotHeldError",
    "ParsedRolloutRecoveryState",
    "PromptGroupPhase",
    "PromptGroupRecoveryRecord",
    "PromptGroupStatus",
    "PromptIdentityError",
    "PromptPayloadUnboundError",
    "PromptRef",
    "RecoveryGranularity",
    "RewardChecks",
    "RewardLogContext",
    "RolloutAttemptRecord",
    "RolloutAttemptStatus",
    "RolloutRecoveryLedger",
    "RolloutRecoveryState",
    "RolloutSiblingRecord",
    "SealConflictError",
    "SiblingSealResult",
    "StagedRowDigest",
    "StaleAttemptError",
    "UnknownGroupError",
    "UnsupportedSchemaVersionError",
    "build_rollout_recovery_state",
    "decode_rollout_recovery_state",
    "encode_rollout_recovery_state",
    "parse_rollout_recovery_state",
]
