"""Retry budgets counted from ledger records: what counts, against which budget, and when."""

from __future__ import annotations

import msgspec
import pytest
from ledger_records import (
    ABANDONED,
    CRASH,
    DATA,
    DISPATCHED,
    INFRA,
    RESERVED,
    SEALED,
    Lineage,
    group,
)

from rollvault.config.schema import RolloutConfig
from rollvault.controller.loop.retry_budget import budget_exhausted, retry_spend, was_interrupted

BUDGET = msgspec.structs.replace(
    RolloutConfig(), max_sibling_retries=2, max_interrupted_retries=3, max_group_retries=1
)


def test_a_fresh_group_has_spent_nothing() -> None:
    record = group([RESERVED], [RESERVED])
    assert retry_spend(record).sibling_failures == (0, 0)
    assert retry_spend(record).data_failure_rounds == 0
    assert budget_exhausted(record, BUDGET) is None


def test_infra_failures_spend_the_siblings_budget() -> None:
    record = group([INFRA, INFRA, RESERVED], [SEALED])
    assert retry_spend(record).sibling_failures == (2, 0)
    assert budget_exhausted(record, BUDGET) is None  # two failures, two retries allowed
    over = group([INFRA, INFRA, INFRA, RESERVED], [SEALED])
    reason = budget_exhausted(over, BUDGET)
    assert reason is not None and "sibling 0" in reason and "max_sibling_retries=2" in reason


def test_interruptions_spend_their_own_budget_not_the_infra_one() -> None:
    # Three deaths with sibling 0 in flight: more than the infra budget allows, kept.
    record = group([CRASH, INFRA, CRASH, CRASH, RESERVED], [SEALED])
    spend = retry_spend(record)
    assert (spend.sibling_failures, spend.sibling_interruptions) == ((1, 0), (3, 0))
    assert budget_exhausted(record, BUDGET) is None
    over = group([CRASH, CRASH, CRASH, CRASH, RESERVED], [SEALED])
    reason = budget_exhausted(over, BUDGET)
    assert reason is not None and "sibling 0" in reason
    assert "max_interrupted_retries=3" in reason


def test_the_default_interruption_budget_is_larger_than_the_infra_one() -> None:
    rollout = RolloutConfig()
    assert rollout.max_interrupted_retries > rollout.max_sibling_retries
    kills = rollout.max_interrupted_retries
    assert budget_exhausted(group([CRASH] * kills + [RESERVED]), rollout) is None
    assert budget_exhausted(group([CRASH] * (kills + 1) + [RESERVED]), rollout) is not None


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


@pytest.mark.parametrize(
    ("lineages", "suspect"),
    [
        ([[CRASH, RESERVED], [SEALED]], True),
        ([[CRASH, DISPATCHED], [SEALED]], True),
        ([[CRASH]], True),
        # It ran again since, and the process survived: no longer a suspect.
        ([[CRASH, INFRA, RESERVED]], False),
        ([[CRASH, SEALED]], False),
        ([[INFRA, RESERVED]], False),
        ([[RESERVED], [RESERVED]], False),
    ],
)
def test_a_group_is_a_suspect_while_its_last_finished_attempt_was_interrupted(
    lineages: list[Lineage], suspect: bool
) -> None:
    assert was_interrupted(group(*lineages)) is suspect
