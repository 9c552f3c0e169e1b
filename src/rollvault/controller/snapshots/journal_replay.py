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
* **Seals of later attempts of a sibling the snapshot holds unsealed**: a
  restart from this very snapshot that was killed before its own first
  snapshot minted fresh attempts for the snapshot's interrupted siblings and
  journaled their seals; the snapshot names the older attempt, which is dead
  with its process. Such a seal is adopted by the sibling's current attempt
  (as for a group reserved after the snapshot: its tokens staged under that
  attempt's keys, its receipt naming it, ``adopted_from`` the attempt that
  generated them) when the attempt is live (reserved or dispatched), the seal
  lists the attempt's committed turns first (none, or the turns the restart's
  fresh attempt inherited from it and continued: a snapshot taken between a
  turn's commit and its attempt's seal holds them; they keep their keys, only
  the later turns are staged under the attempt's), the group is generating at
  ``sibling`` granularity (``prompt_group`` redoes an incomplete group whole)
  and the seal was stamped for the group's target step. Without it, two
  restarts in a row killed before their first snapshot would generate durable
  seals again. A seal whose episode restarted from its first turn (it does not
  list the committed turns) stays fenced off.
* **Groups reserved after the snapshot** are not in its ledger (their ids
  and their attempts' ids were random), but the restored dataloader reserves
  the same prompts again, in the same order. Their seals are pooled by
  prompt (epoch, dataset index) and sibling in
  :attr:`~rollvault.controller.loop.parts.RolloutParts.journaled_seals`;
  when the rollout pump reserves the prompt again, :func:`adopt_journaled_seals`
  seals the new group's fresh attempts with them, inside the same mutation
  section as the reservation and before any of them is dispatched: the
  journaled tokens are staged under the new attempt's keys, and its receipt
  names the new attempt, so fencing holds for the new attempt as for any
  other (the old one is dead with its process). Only a seal stamped for the
  same target step is adopted (the staleness the sampler allowed then holds
  now), and under ``prompt_group`` only a complete group of one old group
  (siblings must share one weight version). The attempt log names the old
  attempt (``adopted_from``). The pool is controller state: a snapshot
  keeps the seals still pooled (``controller_state.json``'s
  ``pooled_seals``), because once it commits the journal segments that
  held them are dropped; a restore pools the snapshot's seals first, then
  the journal's records after it.
* **Partials** (``rollout.prefix_resume``): the newest one of each attempt,
  read after every seal, goes to its sibling while that attempt is the
  sibling's current, live one with exactly the turns before the partial's
  committed (fenced by attempt id); the restorer then hands it to the fresh
  attempt ``prepare_for_restart`` makes. A partial of a group reserved after
  the snapshot is pooled by prompt and sibling and given to the prompt's next
  group, as seals are (:func:`adopt_journaled_partials`). A partial of an
  attempt the snapshot's ledger does not know at all (one a restart killed
  before its first snapshot minted, as for seals above) goes to the sibling
  too, under the same conditions as an adopted seal but with exactly the
  turns before it committed; a partial of an attempt the ledger knows as an
  older one of the sibling stays fenced off (a retry starts afresh).
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
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rollvault.controller.loop.episodes import logical_id
from rollvault.controller.loop.journal_rows import decode_row
from rollvault.controller.loop.partials import owns_partial, partial_turn
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import AttemptLogRecord, TurnLogRecord
from rollvault.controller.loop.seal_journal import (
    DecodedRecord,
    FinalizeRecord,
    PartialRecord,
    SealJournal,
    SealRecord,
    StepRecord,
    decode_replay,
)
from rollvault.dataplane.interface import STAGING_PARTITION, staging_key
from rollvault.dataplane.rows import Row
from rollvault.ledger.receipts import validate_receipt
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.statuses import (
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

_LOG = logging.getLogger("rollvault.restore")


@dataclass
class JournalReplayCounts:
    """What replaying the seal journal kept, for the restore log."""

    records: int = 0
    """Records at or after the snapshot's seq."""
    seals_replayed: int = 0
    seals_already_in_snapshot: int = 0
    seals_unmatched: int = 0
    """Seals of attempts the restored ledger holds no longer (fenced): generated again."""
    seals_pooled: int = 0
    """Seals of groups reserved after the snapshot, kept for their prompts' next groups."""
    finalizations: int = 0
    steps: int = 0
    partials_matched: int = 0
    """Attempts whose journaled partial turn a fresh attempt continues (prefix resume)."""
    partials_pooled: int = 0
    """Partials of groups reserved after the snapshot, kept for their prompts' next groups."""
    partials_unmatched: int = 0
    """Partials of attempts that sealed, ended or were superseded (fenced): not used."""
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
    partials: dict[str, PartialRecord] = {}
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
        elif isinstance(entry, PartialRecord):
            partials[entry.gate_rollout_id] = entry  # cumulative: the newest one is the prefix
    # After every seal: a partial of an attempt that sealed meanwhile is not needed.
    for partial in partials.values():
        _replay_partial(parts, partial, counts)
    _LOG.info(
        "seal journal: %d records after the snapshot, %d seals replayed, %d already in it, "
        "%d of groups reserved after it (adopted when their prompts are reserved again), "
        "%d unmatched (generated again)%s",
        counts.records,
        counts.seals_replayed,
        counts.seals_already_in_snapshot,
        counts.seals_pooled,
        counts.seals_unmatched,
        f"; cut off {counts.damage}" if counts.damage else "",
    )
    return counts


def _replay_partial(
    parts: RolloutParts, partial: PartialRecord, counts: JournalReplayCounts
) -> None:
    """Give the sibling of a still-live attempt its partial turn; pool that of a lost group.

    The restorer checks the sibling's fresh attempt after ``prepare_for_restart``
    (:mod:`rollvault.controller.loop.partials`).
    """
    if partial.group_id not in parts.ledger:
        if partial.group_id in parts.groups or partial.turn_index != 0:
            counts.partials_unmatched += 1  # finished in the snapshot, or its turns are lost
            return
        prompt = (partial.epoch, partial.dataset_idx, partial.generation_index)
        parts.partials.pooled[prompt] = partial
        counts.partials_pooled += 1
        return
    group = parts.ledger.borrowed_group(partial.group_id)
    if not owns_partial(group, partial) and not _adoptable_partial(group, partial):
        counts.partials_unmatched += 1
        return
    key = logical_id(partial.group_id, partial.generation_index)
    parts.partials.resumed[key] = partial_turn(partial)
    counts.partials_matched += 1


def _adoptable_partial(group: PromptGroupRecoveryRecord, partial: PartialRecord) -> bool:
    """Whether ``partial`` of an attempt unknown to the snapshot may go to its sibling.

    See the module docstring: an attempt minted after the snapshot by a start
    that died before its own, while the sibling's current attempt is live with
    exactly the turns before the partial's committed.
    """
    if partial.generation_index >= len(group.siblings):
        return False
    sibling = group.siblings[partial.generation_index]
    attempt = sibling.current_attempt
    return (
        group.status is PromptGroupStatus.GENERATING
        and group.recovery_granularity is RecoveryGranularity.SIBLING
        and attempt.status in (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
        and len(attempt.turn_keys) == partial.turn_index
        and partial.target_step == group.target_step
        and all(known.attempt_id != partial.attempt_hex for known in sibling.attempts)
    )


def adopt_journaled_partials(parts: RolloutParts, group_id: str, sealed: set[int]) -> int:
    """Give a just-reserved group's unsealed siblings the pooled partials of its prompt.

    Only a partial stamped for the same target step, as for seals. Returns how many.
    """
    pooled = parts.partials.pooled
    if not pooled:
        return 0
    origin = parts.group(group_id).origin
    record = parts.ledger.borrowed_group(group_id)
    adopted = 0
    for sibling in record.siblings:
        index = sibling.generation_index
        partial = pooled.pop((origin.epoch, origin.dataset_idx, index), None)
        if partial is None or index in sealed or partial.target_step != record.target_step:
            continue
        parts.partials.resumed[logical_id(group_id, index)] = partial_turn(partial)
        adopted += 1
    return adopted


def pool_seal(parts: RolloutParts, seal: SealRecord) -> None:
    """Keep ``seal`` of a lost group for its prompt's next group (see the module docstring)."""
    pool = parts.journaled_seals.setdefault((seal.epoch, seal.dataset_idx), {})
    pool[seal.generation_index] = seal  # a later seal of the sibling replaces it


async def _replay_seal(
    parts: RolloutParts, record: DecodedRecord, seal: SealRecord, counts: JournalReplayCounts
) -> None:
    if seal.group_id not in parts.ledger:
        if seal.group_id in parts.groups:
            counts.seals_already_in_snapshot += 1  # canonical (or trained) in the snapshot
        else:
            pool_seal(parts, seal)
            counts.seals_pooled += 1
        return
    # Borrowed (no copy): everything read from it is read before the ledger changes it.
    group = parts.ledger.borrowed_group(seal.group_id)
    if seal.generation_index >= len(group.siblings):
        counts.seals_unmatched += 1
        return
    attempt = group.siblings[seal.generation_index].current_attempt
    if attempt.attempt_id != seal.attempt_hex:
        if _adoptable_by_current_attempt(group, attempt, seal):
            await _adopt_onto_current(parts, group, seal)
            counts.seals_replayed += 1
        else:
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
    committed = len(attempt.turn_keys)
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
    _relog_turns(parts, seal, rows, committed=committed)
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
            adopted_from=seal.adopted_from,
        )
    )


def _adoptable_by_current_attempt(
    group: PromptGroupRecoveryRecord, attempt: RolloutAttemptRecord, seal: SealRecord
) -> bool:
    """Whether ``seal`` of another attempt of the sibling may seal its current ``attempt``.

    See the module docstring: a later attempt's seal, the current one still live.
    """
    return (
        group.status is PromptGroupStatus.GENERATING
        and group.recovery_granularity is RecoveryGranularity.SIBLING
        and attempt.status in (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
        and _lists_committed_turns(seal, attempt)
        and seal.target_step == group.target_step
    )


def _lists_committed_turns(seal: SealRecord, attempt: RolloutAttemptRecord) -> bool:
    """Whether ``seal``'s episode begins with ``attempt``'s committed turns (or it has none).

    A fresh attempt of a restart inherits the committed turns of the attempt it
    replaces and continues the episode after them: its receipt lists them first,
    under the keys they were committed with.
    """
    committed = attempt.turn_keys
    if not committed:
        return True
    keys = validate_receipt(seal.receipt, where=seal.gate_rollout_id).staging_keys
    return keys[: len(committed)] == committed


async def _adopt_onto_current(
    parts: RolloutParts, group: PromptGroupRecoveryRecord, seal: SealRecord
) -> None:
    index = seal.generation_index
    # ``group`` is borrowed: read it before the ledger changes it.
    gate_rollout_id = group.gate_rollout_id(index)
    committed = len(group.siblings[index].current_attempt.turn_keys)
    if group.siblings[index].current_attempt.status is RolloutAttemptStatus.RESERVED:
        parts.ledger.mark_group_dispatched(parts.cut, group.group_id, generation_indices=[index])
    await _adopt_one(parts, gate_rollout_id, group.group_id, index, seal, committed=committed)


def _relog_turns(
    parts: RolloutParts,
    seal: SealRecord,
    rows: Mapping[str, Row],
    *,
    committed: int,
    gate_rollout_id: str | None = None,
    keys: list[str] | None = None,
) -> None:
    """Log again the turns the seal holds beyond the ones the snapshot has committed.

    Their ``turns.jsonl`` lines came after the snapshot and are rolled back
    with it; the turns stand again (in the replayed seal), so must their lines.
    ``gate_rollout_id`` and ``keys``: those of the attempt that adopted the seal
    (None: the seal's own).
    """
    if keys is None:
        keys = validate_receipt(seal.receipt, where=seal.gate_rollout_id).staging_keys
    for turn_index, key in enumerate(keys):
        if turn_index < committed:
            continue
        mask = rows[key].get("token_mask")
        parts.logs.turns.write(
            TurnLogRecord(
                gate_rollout_id=gate_rollout_id or seal.gate_rollout_id,
                group_id=seal.group_id,
                generation_index=seal.generation_index,
                turn_index=turn_index,
                staging_key=key,
                num_tokens=int(np.asarray(mask).sum()) if mask is not None else 0,
                incarnation=parts.logs.incarnation,
            )
        )


async def adopt_journaled_seals(parts: RolloutParts, group_id: str) -> dict[int, SealRecord]:
    """Seal a just-reserved group's siblings with the journaled seals of its prompt.

    Call inside the reservation's mutation section, before the group is
    dispatched. Returns the seals adopted by generation index (see the module docstring).
    The siblings it does not seal get the prompt's pooled partials, if any.
    """
    adopted = await _adopt_seals(parts, group_id)
    adopt_journaled_partials(parts, group_id, set(adopted))
    return adopted


async def _adopt_seals(parts: RolloutParts, group_id: str) -> dict[int, SealRecord]:
    origin = parts.group(group_id).origin
    pool = parts.journaled_seals.pop((origin.epoch, origin.dataset_idx), None)
    if not pool:
        return {}
    record = parts.ledger.borrowed_group(group_id)
    seals = {
        index: seal
        for index, seal in pool.items()
        if seal.target_step == record.target_step and index < len(record.siblings)
    }
    if record.recovery_granularity is RecoveryGranularity.PROMPT_GROUP and (
        len(seals) != len(record.siblings) or len({s.group_id for s in seals.values()}) != 1
    ):
        return {}
    if not seals:
        return {}
    adopted = sorted(seals)
    # ``record`` is borrowed: its gate ids are read before the ledger changes it.
    gate_ids = {index: record.gate_rollout_id(index) for index in adopted}
    parts.ledger.mark_group_dispatched(parts.cut, group_id, generation_indices=adopted)
    for index in adopted:
        await _adopt_one(parts, gate_ids[index], group_id, index, seals[index])
    return {index: seals[index] for index in adopted}


async def _adopt_one(
    parts: RolloutParts,
    gate_rollout_id: str,
    group_id: str,
    index: int,
    seal: SealRecord,
    *,
    committed: int = 0,
) -> None:
    """Seal the attempt ``gate_rollout_id`` with ``seal``'s tokens.

    ``committed``: the attempt's committed turns, which ``seal`` lists first
    (:func:`_lists_committed_turns`): they keep their keys; the later turns are
    staged under the attempt's own keys, and their ``turns.jsonl`` lines written
    again (the killed start's lines are rolled back with the snapshot).
    """
    old_keys = validate_receipt(seal.receipt, where=seal.gate_rollout_id).staging_keys
    new_keys = old_keys[:committed] + [
        staging_key(gate_rollout_id, call) for call in range(committed, len(old_keys))
    ]
    where = f"journaled seal of {seal.gate_rollout_id}"
    rows = {
        new: decode_row(seal.rows[old], where=f"{where}, row {old!r}")
        for old, new in zip(old_keys, new_keys, strict=True)
    }
    await parts.data_plane.put(STAGING_PARTITION, rows)
    parts.ledger.mark_sibling_sealed(
        parts.cut,
        group_id,
        generation_index=index,
        gate_rollout_id=gate_rollout_id,
        receipt={**seal.receipt, "gate_rollout_id": gate_rollout_id, "staging_keys": new_keys},
        reward=seal.reward,
        mask_sample=seal.mask_sample,
        reward_checks=seal.reward_checks,
        reward_log_context=seal.reward_log_context,
    )
    parts.logs.attempts.write(
        AttemptLogRecord(
            gate_rollout_id=gate_rollout_id,
            group_id=group_id,
            generation_index=index,
            status=RolloutAttemptStatus.SEALED,
            num_tokens=seal.num_tokens,
            incarnation=parts.logs.incarnation,
            reason=f"adopted from the seal journal: the tokens of {_generated_by(seal)}",
            reward=seal.reward,
            checks=seal.checks,
            staging_keys=new_keys,
            adopted_from=_generated_by(seal),
        )
    )
    if committed:
        # The sibling's committed turns have their lines; the turns after them stand
        # again (in the adopted seal), and so must theirs.
        _relog_turns(
            parts, seal, rows, committed=committed, gate_rollout_id=gate_rollout_id, keys=new_keys
        )


def _generated_by(seal: SealRecord) -> str:
    """The attempt that generated a seal's tokens (an adopted seal names its origin)."""
    return seal.adopted_from if seal.adopted_from is not None else seal.gate_rollout_id
