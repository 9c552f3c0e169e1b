"""Ledger records built by hand, for tests of what the controller reads from them."""

from __future__ import annotations

import uuid

from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

A = RolloutAttemptStatus
K = AttemptFailureKind
INFRA = (A.FAILED, K.INFRA)
DATA = (A.FAILED, K.DATA)
CRASH = (A.FAILED, K.INTERRUPTED)
SEALED = (A.SEALED, None)
ABANDONED = (A.ABANDONED, None)
RESERVED = (A.RESERVED, None)
DISPATCHED = (A.DISPATCHED, None)

Lineage = list[tuple[A, K | None]]


def group(
    *siblings: Lineage,
    group_id: str = "g",
    status: PromptGroupStatus = PromptGroupStatus.GENERATING,
) -> PromptGroupRecoveryRecord:
    """A group whose siblings have these attempts, oldest first (fresh random UUIDs)."""
    return PromptGroupRecoveryRecord(
        group_id=group_id,
        admission_id="a",
        prompt_id="7",
        prompt_ref=PromptRef(sample_id="7"),
        task_source=None,
        recovery_granularity=RecoveryGranularity.SIBLING,
        expected_generations=len(siblings),
        target_step=0,
        start_weight_version=0,
        siblings=[
            RolloutSiblingRecord(
                generation_index=index,
                attempts=[
                    RolloutAttemptRecord(
                        attempt_uuid=uuid.uuid4(),
                        status=state,
                        failure_kind=kind,
                        failure_reason=None if kind is None else f"{kind.value}: x",
                    )
                    for state, kind in lineage
                ],
            )
            for index, lineage in enumerate(siblings)
        ],
        phase=PromptGroupPhase.ADMITTED,
        status=status,
    )
