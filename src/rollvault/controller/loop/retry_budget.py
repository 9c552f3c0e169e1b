"""Retry budgets, counted from a group's lineage in the recovery ledger.

The ledger records every attempt of every sibling and, for a failed one, its
failure kind, and it is what a snapshot persists. Counting the budgets from
it, rather than in the rollout pump's memory, is what makes them survive a
restart: a prompt whose attempts keep failing, or keep killing the process,
is given up after its budget however many times the run is restarted.

A group may go on generating while all three budgets hold:

- **sibling budget** (``rollout.max_sibling_retries``): per sibling, its
  attempts that failed with kind ``infra``.
- **interruption budget** (``rollout.max_interrupted_retries``): per
  sibling, its attempts that failed with kind ``interrupted``: they were in
  flight when the controller process died (the restore records them so,
  :mod:`rollvault.controller.snapshots.crash_evidence`). They count because
  the controller cannot tell a prompt whose attempt kills the process from a
  kill that came from outside, and if they did not, such a prompt would be
  redispatched first after every restart and the run would crash-loop
  forever. Each attempt in flight at a death is charged once, so a kill
  from outside costs each in-flight sibling one interruption; the rollout
  pump runs a group whose last attempt was interrupted alone
  (:func:`was_interrupted`), so that after the first death only the culprit
  is charged again. That isolated round is also what a restarted run
  dispatches first, so under frequent external kills (a run killed before
  its first snapshot, restart after restart) it is the round most often in
  flight at the next kill: an innocent prompt is charged at every one of
  them. Hence a budget of its own, larger than the infra budget: a real
  poison prompt is in flight at every death it causes, so it still ends
  after ``max_interrupted_retries + 1`` deaths, a bounded number of
  restarts, while an unlucky prompt survives a run of kills that the infra
  budget would have ended it at.
- **group budget** (``rollout.max_group_retries``): the rounds in which some
  sibling failed with kind ``data``. A sibling takes part in every round of
  its group from the first until it seals (at either recovery granularity),
  so its n-th attempt ran in the group's n-th round, and the rounds are the
  distinct attempt positions at which a data failure is recorded.

Abandoned attempts spend nothing: they were given up by the controller (a
restart that redoes unfinished work, a ``prompt_group`` cohort discarded
because another sibling failed), not failed by the gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollvault.config.schema import RolloutConfig
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.statuses import AttemptFailureKind, RolloutAttemptStatus

_LIVE = frozenset({RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED})


@dataclass(frozen=True)
class RetrySpend:
    """What a group has spent of its budgets so far."""

    data_failure_rounds: int
    """Rounds in which some sibling failed with kind ``data``."""
    sibling_failures: tuple[int, ...]
    """Per sibling, its failures of kind ``infra``."""
    sibling_interruptions: tuple[int, ...]
    """Per sibling, its failures of kind ``interrupted``."""


def retry_spend(record: PromptGroupRecoveryRecord) -> RetrySpend:
    """Count what ``record``'s lineage has spent (see the module docstring)."""
    data_rounds: set[int] = set()
    failures: list[int] = []
    interruptions: list[int] = []
    for sibling in record.siblings:
        infra = interrupted = 0
        for position, attempt in enumerate(sibling.attempts):
            kind = _failure_kind(attempt)
            if kind is AttemptFailureKind.DATA:
                data_rounds.add(position)
            elif kind is AttemptFailureKind.INFRA:
                infra += 1
            elif kind is AttemptFailureKind.INTERRUPTED:
                interrupted += 1
        failures.append(infra)
        interruptions.append(interrupted)
    return RetrySpend(
        data_failure_rounds=len(data_rounds),
        sibling_failures=tuple(failures),
        sibling_interruptions=tuple(interruptions),
    )


def budget_exhausted(record: PromptGroupRecoveryRecord, rollout: RolloutConfig) -> str | None:
    """Why ``record`` may not be retried again (None: it may).

    Over budget means more failures than retries allowed: with
    ``max_sibling_retries = 3`` a sibling's fourth infrastructure failure
    ends the group, with ``max_interrupted_retries = 8`` its ninth
    interruption does.
    """
    spend = retry_spend(record)
    if spend.data_failure_rounds > rollout.max_group_retries:
        return (
            f"{spend.data_failure_rounds} rounds with a data failure, more than "
            f"rollout.max_group_retries={rollout.max_group_retries}"
        )
    for index, failures in enumerate(spend.sibling_failures):
        if failures > rollout.max_sibling_retries:
            return (
                f"sibling {index} failed {failures} times, more than "
                f"rollout.max_sibling_retries={rollout.max_sibling_retries}"
            )
    for index, interruptions in enumerate(spend.sibling_interruptions):
        if interruptions > rollout.max_interrupted_retries:
            return (
                f"sibling {index} was in flight at {interruptions} deaths of the process, "
                f"more than rollout.max_interrupted_retries={rollout.max_interrupted_retries} "
                "(a poison prompt)"
            )
    return None


def was_interrupted(record: PromptGroupRecoveryRecord) -> bool:
    """Whether some sibling's last finished attempt was interrupted by the process's death.

    Such a group is a suspect: its attempt may be what killed the process.
    Once it has run again without a death, it is not one any more.
    """
    for sibling in record.siblings:
        finished = [attempt for attempt in sibling.attempts if attempt.status not in _LIVE]
        if finished and _failure_kind(finished[-1]) is AttemptFailureKind.INTERRUPTED:
            return True
    return False


def _failure_kind(attempt: RolloutAttemptRecord) -> AttemptFailureKind | None:
    if attempt.status is not RolloutAttemptStatus.FAILED:
        return None
    return attempt.failure_kind
