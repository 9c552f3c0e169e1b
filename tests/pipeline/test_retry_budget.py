"""Retry budgets counted from ledger records: what counts, against which budget, and when."""

from __future__ import annotations

import uuid

import msgspec

from rollvault.config.schema import RolloutConfig
from rollvault.controller.loop.retry_budget import budget_exhausted, retry_spend
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


def group(*siblings: Lineage) -> PromptGroupRecoveryRecord:
    """A generating group whose siblings have these attempts, oldest first."""
    return PromptGroupRecoveryRecord(
        group_id="g",
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
                        status=status,
                        failure_kind=kind,
                        failure_reason=None if kind is None else f"{kind.value}: x",
                    )
                    for status, kind in lineage
                ],
            )
            for index, lineage in enumerate(siblings)
        ],
        phase=PromptGroupPhase.ADMITTED,
        status=PromptGroupStatus.GENERATING,
    )


BUDGET = msgspec.structs.replace(RolloutConfig(), max_sibling_retries=2, max_group_retries=1)


def test_a_fresh_group_has_spent_nothing() -> None:
    record = group([RESERVED], [RESERVED])
    assert retry_spend(record).sibling_failures == (0, 0)
    assert retry_spend(record).data_failure_rounds == 0
    assert budget_exhausted(record, BUDGET) is None


def test_infra_and_interrupted_failures_spend_the_siblings_budget() -> None:
    record = group([INFRA, CRASH, RESERVED], [SEALED])
    assert retry_spend(record).sibling_failures == (2, 0)
    assert budget_exhausted(record, BUDGET) is None  # two failures, two retries allowed
    over = group([INFRA, CRASH, CRASH, RESERVED], [SEALED])
    reason = budget_exhausted(over, BUDGET)
    assert reason is not None and "sibling 0" in reason and "max_sibling_retries=2" in reason


def test_data_failures_spend_the_groups_budget_once_per_round() -> None:
    # Round 0: both siblings failed on data; round 1: only sibling 1 did.
    record = group([DATA, SEALED], [DATA, DATA, RESERVED])
    spend = retry_spend(record)
    assert spend.data_failure_rounds == 2
    assert spend.sibling_failures == (0, 0)
    reason = budget_exhausted(record, BUDGET)
    assert reason is not None and "max_group_retries=1" in reason
    assert budget_exhausted(group([DATA, RESERVED], [DATA, RESERVED]), BUDGET) is None


def test_abandoned_attempts_spend_nothing() -> None:
    # Abandoned by a restart or with a prompt_group cohort: given up, not failed.
    record = group([ABANDONED, ABANDONED, ABANDONED, ABANDONED, RESERVED])
    assert retry_spend(record) == retry_spend(group([RESERVED]))
    assert budget_exhausted(record, BUDGET) is None
