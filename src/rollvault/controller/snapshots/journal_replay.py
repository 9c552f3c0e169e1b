"""Replay the seal journal on top of a restored snapshot.

Restore = newest verified snapshot + the journal's records from the
snapshot's ``seal_journal_seq`` on, in order, up to the first torn or corrupt
record (:func:`~rollvault.durable.journal_writer.repair_journal` cut it off
when the journal was opened; the restore log names it).

What is replayed, and why it keeps DESIGN's invariants:

* **Seals** are re-applied with the ledger's own transitions, to *the very
  attempt* that sealed: a seal record names its attempt (its gate rollout
  id), and it is applied only while that attempt is its sibling's current
  attempt in the restored ledger (reserved: it is marked dispatched first;
  dispatched: sealed). That is fencing by attempt id, unchanged: a record of
  any other attempt is not applied. Its staged rows go back into the data
  plane first. A seal the snapshot already holds is a no-op (both the ledger
  and the data plane accept an identical repeat), so replay is idempotent.
* **Groups reserved after the snapshot** are not in its ledger, and their
  attempts' ids were random: their seals cannot be matched and are
  generated again (counted as ``seals_unmatched``). The restored dataloader
  reserves the same prompts again, so every prompt still trains once.
* **Finalizations and step boundaries** need no re-application: a restore
  rolls the trainer back to the snapshot's trainer checkpoint anyway, and a
  group whose every sibling is sealed again is finalized again by the rollout
  pump, deterministically (the same staged rows, rewards and settings), then
  trained in its stamped step. They are counted, so the log says how much of
  the lost timeline the journal held.

Replay runs inside the restore's mutation section, after the ledger is
loaded and before the dispatch journal's crash evidence and
``prepare_for_restart`` (a replayed attempt is sealed, so neither charges nor
re-mints it).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import AttemptLogRecord
from rollvault.controller.loop.seal_journal import (
    DecodedRecord,
    FinalizeRecord,
    SealJournal,
    SealRecord,
    StepRecord,
    decode_replay,
    decode_row,
)
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus

_LOG = logging.getLogger("rollvault.restore")


@dataclass
class JournalReplayCounts:
    """What replaying the seal journal kept, for the restore log."""

    records: int = 0
    """Records at or after the snapshot's seq."""
    seals_replayed: int = 0
    seals_already_in_snapshot: int = 0
    seals_unmatched: int = 0
    """Seals of groups or attempts the restored ledger does not hold: generated again."""
    finalizations: int = 0
    steps: int = 0
    damage: str | None = None
    """The torn or corrupt record the journal was cut back to (None: none)."""
    quarantined: list[str] = dataclasses.field(default_factory=list)


async def replay_seal_journal(
    parts: RolloutParts, journal: SealJournal, *, from_seq: int
) -> JournalReplayCounts:
    """Re-apply the journal's seals from ``from_seq`` on; call inside a mutation section."""
    counts = JournalReplayCounts(
        damage=journal.repair.truncated.describe() if journal.repair.truncated else None,
        quarantined=[str(path) for path in journal.repair.quarantined],
    )
    for record in decode_replay(journal.repair.replay):
        if record.seq < from_seq:
            continue
        counts.records += 1
        entry = record.entry
        if isinstance(entry, SealRecord):
            await _replay_seal(parts, record, entry, counts)
        elif isinstance(entry, FinalizeRecord):
            counts.finalizations += 1
        elif isinstance(entry, StepRecord):
            counts.steps += 1
    _LOG.info(
        "seal journal: %d records after the snapshot, %d seals replayed, %d already in it, "
        "%d unmatched (generated again)%s",
        counts.records,
        counts.seals_replayed,
        counts.seals_already_in_snapshot,
        counts.seals_unmatched,
        f"; cut off {counts.damage}" if counts.damage else "",
    )
    return counts


async def _replay_seal(
    parts: RolloutParts, record: DecodedRecord, seal: SealRecord, counts: JournalReplayCounts
) -> None:
    if seal.group_id not in parts.ledger:
        if seal.group_id in parts.replay:
            counts.seals_already_in_snapshot += 1
        else:
            counts.seals_unmatched += 1
        return
    group = parts.ledger.get_group(seal.group_id)
    if seal.generation_index >= len(group.siblings):
        counts.seals_unmatched += 1
        return
    attempt = group.siblings[seal.generation_index].current_attempt
    if attempt.attempt_id != seal.attempt_hex:
        counts.seals_unmatched += 1  # fenced: another attempt owns the sibling now
        return
    if attempt.status is RolloutAttemptStatus.SEALED:
        counts.seals_already_in_snapshot += 1
        return
    if group.status is not PromptGroupStatus.GENERATING or attempt.status not in (
        RolloutAttemptStatus.RESERVED,
        RolloutAttemptStatus.DISPATCHED,
    ):
        counts.seals_unmatched += 1
        return
    where = f"{record.segment} at byte {record.offset} (record {record.seq})"
    rows = {key: decode_row(row, where=f"{where}, row {key!r}") for key, row in seal.rows.items()}
    await parts.data_plane.put(STAGING_PARTITION, rows)
    if attempt.status is RolloutAttemptStatus.RESERVED:
        parts.ledger.mark_group_dispatched(
            parts.cut, seal.group_id, generation_indices=[seal.generation_index]
        )
    parts.ledger.mark_sibling_sealed(
        parts.cut,
        seal.group_id,
        generation_index=seal.generation_index,
        gate_rollout_id=seal.gate_rollout_id,
        receipt=seal.receipt,
        reward=seal.reward,
        mask_sample=seal.mask_sample,
        reward_checks=seal.reward_checks,
        reward_log_context=seal.reward_log_context,
    )
    counts.seals_replayed += 1
    # The first start's line of this seal comes after the snapshot, so the
    # restore rolls it back; the seal stands again, and so must its line.
    parts.logs.attempts.write(
        AttemptLogRecord(
            gate_rollout_id=seal.gate_rollout_id,
            group_id=seal.group_id,
            generation_index=seal.generation_index,
            status=RolloutAttemptStatus.SEALED,
            num_tokens=seal.num_tokens,
            incarnation=parts.logs.incarnation,
            reason="replayed from the seal journal",
            reward=seal.reward,
            checks=seal.checks,
            staging_keys=list(seal.rows),
        )
    )
