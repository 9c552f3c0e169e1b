"""What a restore learns from the dispatch journal: the attempts the process's death interrupted.

An attempt was in flight when the process died when it was dispatched (the
restored snapshot holds it ``dispatched``, or the journal has it dispatched
after the snapshot) and it never came back (no ``returned`` line: neither
sealed, nor failed, nor cancelled by the controller). Such an attempt is an
interrupted failure of its sibling, and it spends the sibling's
interruption budget, ``rollout.max_interrupted_retries``
(:mod:`rollvault.controller.loop.retry_budget` says why, and why that budget
is not the infra one). Every attempt in flight is charged, whether its
round ran alone or beside others: an attempt the snapshot holds
``dispatched`` carries no record of how its round ran, and when kills come
before snapshots, start after start, it is a suspect's isolated round that
is in flight at each of them, which sparing the shared rounds would not
spare; the size of the interruption budget is what keeps such a prompt.
A restore records it:

- in the ledger, for a group the snapshot holds that is still generating
  (``RolloutRecoveryLedger.mark_attempt_interrupted``), the snapshot's
  current attempt first and then the ones minted after the snapshot;
- otherwise the group was reserved after the snapshot and is lost with the
  process, so the attempt is kept as a :class:`LostGroupInterruption` for
  the next group of the same prompt (same epoch and dataset index).

An attempt that came back after the snapshot is not charged: its result is
lost with the process, but it did not kill it, and the restore redoes it as
it always did. Nor is one the snapshot holds ``reserved`` and the journal
never saw dispatched.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from rollvault.controller.loop.dispatch_journal import JournalTail, LostGroupInterruption
from rollvault.ledger.records import (
    InterruptedAttempt,
    PromptGroupRecoveryRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.statuses import (
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)


@dataclass(frozen=True)
class CrashEvidence:
    """The interrupted attempts a restore records."""

    in_ledger: dict[str, list[InterruptedAttempt]] = field(default_factory=dict)
    """Per restored generating group, its interrupted attempts, each sibling's oldest first."""
    lost: list[LostGroupInterruption] = field(default_factory=list)
    """Interrupted attempts of groups the snapshot does not hold."""

    @property
    def count(self) -> int:
        return sum(map(len, self.in_ledger.values())) + len(self.lost)


def crash_evidence(
    records: list[PromptGroupRecoveryRecord], tail: JournalTail, *, reason: str
) -> CrashEvidence:
    """Sort the journal's unreturned attempts into the restored ``records`` and lost groups.

    ``records`` are the restored ledger's groups before ``prepare_for_restart``.
    """
    held = {record.group_id: record for record in records}
    # Per group, then per sibling: a restore looks up each of ~16k siblings, and most
    # groups have nothing journaled since the snapshot (one lookup for all 16).
    later: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    evidence = CrashEvidence()
    for line in tail.dispatched:
        if line.group_id in held:
            journaled_group = later[line.group_id]
            for attempt in line.attempts:
                journaled_group[attempt.generation_index].append(attempt.attempt_uuid)
            continue
        evidence.lost.extend(
            LostGroupInterruption(
                group_id=line.group_id,
                epoch=line.epoch,
                dataset_idx=line.dataset_idx,
                generation_index=attempt.generation_index,
                attempt_uuid=attempt.attempt_uuid,
                reason=reason,
            )
            for attempt in line.attempts
            if attempt.attempt_uuid not in tail.returned
        )
    no_journal: dict[int, list[str]] = {}
    for record in records:
        if record.status is not PromptGroupStatus.GENERATING:
            continue  # nothing of it can have been dispatched since the snapshot
        interrupted = []
        journaled_group = later.get(record.group_id, no_journal)
        per_sibling = record.recovery_granularity is RecoveryGranularity.SIBLING
        for sibling in record.siblings:
            journaled = journaled_group.get(sibling.generation_index)
            current = sibling.attempts[-1]
            if current.status is RolloutAttemptStatus.SEALED and per_sibling:
                # Sealed by the journal's replay (a seal of a restart's attempt, adopted
                # by the snapshot's): the attempts restarts dispatched after the
                # snapshot and lost are superseded by the seal the journal kept, and
                # the finished sibling is redone no more. (Sealed in the snapshot, a
                # ``sibling`` sibling was dispatched no more after it.)
                continue
            if journaled is None:
                # Nothing dispatched since the snapshot (most siblings): only the
                # current attempt can be in flight, and its UUID is at hand.
                if current.status is RolloutAttemptStatus.DISPATCHED and not (
                    # A UUID's hex is a Python property: none computed when nothing returned.
                    tail.returned and current.attempt_uuid.hex in tail.returned
                ):
                    interrupted.append(
                        InterruptedAttempt(
                            generation_index=sibling.generation_index,
                            attempt_uuid=current.attempt_uuid,
                            reason=reason,
                        )
                    )
                continue
            interrupted += [
                InterruptedAttempt(
                    generation_index=sibling.generation_index,
                    attempt_uuid=uuid.UUID(hex=attempt_hex),
                    reason=reason,
                )
                for attempt_hex in _in_flight_since(sibling, journaled)
                if attempt_hex not in tail.returned
            ]
        if interrupted:
            evidence.in_ledger[record.group_id] = interrupted
    return evidence


def _in_flight_since(sibling: RolloutSiblingRecord, journaled: list[str]) -> list[str]:
    """The sibling's attempts dispatched at the snapshot or after it, oldest first."""
    current = sibling.attempts[-1]
    dispatched = [current.attempt_id] if current.status is RolloutAttemptStatus.DISPATCHED else []
    superseded = {attempt.attempt_id for attempt in sibling.attempts[:-1]}
    for attempt_hex in journaled:
        # An attempt superseded before the snapshot finished before it, too.
        if attempt_hex not in dispatched and attempt_hex not in superseded:
            dispatched.append(attempt_hex)
    return dispatched
