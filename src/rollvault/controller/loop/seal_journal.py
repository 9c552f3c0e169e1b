"""The seal journal: every seal, finalization and train step since the newest snapshot.

Snapshots are seconds apart; without the journal everything sealed since the
last one is generated again after a kill. The rollout pump, the finalizer and
the train pump hand a record of each applied change to a
:class:`~rollvault.durable.journal_writer.JournalWriter` (CRC-framed
segments, group commit on a writer thread, :mod:`rollvault.durable`), by
default one in a child process of its own
(:class:`~rollvault.durable.journal_process.JournalProcessWriter`,
``rollout_checkpointing.journal.writer``), *after* the change was applied and
*outside* the mutation cut: the journal encodes each record on the event loop
(:func:`encode_entry`, right after it was built) and hands its bytes over; the
writer frames each group of records into one buffer, writes it and flushes
it with one ``fsync``, at most once per
``rollout_checkpointing.journal.commit_interval_ms`` (or per
``max_batch_records``). A seal is *kept* once its record is durable.

What is durable when: a seal (and a partial) record opens a group commit, so it
is durable within about the commit interval. Finalize and step records are
appended *lazily* (:meth:`~rollvault.durable.journal_writer.JournalWriter.append_many`
with ``lazy=True``): they open no group of their own but ride on the next one
(the next generation batch's seals), a rotation or the close, or are flushed
alone after ``rollout_checkpointing.journal.lazy_interval_ms`` (1,000 ms). Nothing depends on them
being durable sooner: replay only counts them (a restore rolls the trainer
back to the snapshot's trainer checkpoint and finalizes the replayed groups
again, :mod:`~rollvault.controller.snapshots.journal_replay`), no caller waits
for them, and the journal stays a prefix in sequence order, so a lazy record
never lets a later seal become durable before it. This saves the ``fsync``
each of them started (about two per train step on the GRPO recipe).
Finalizations are not even handed over one by one: the journal holds them
and appends them as one record (:class:`FinalizeBatchRecord`) just before its
next record, so they still stand in the order they were applied; the train
step's record bounds their wait to a step. A snapshot appends the held ones
before it takes its seq (:meth:`SealJournal.snapshot_seq`): it reflects them,
so their records stand below its seq, as an unheld record would.

Consistency with snapshots: a snapshot records :meth:`SealJournal.snapshot_seq`
taken inside the cut (``controller_state.json``'s ``seal_journal_seq``).
Because a record is appended after its change is applied, every record below
that seq is reflected in the snapshot; a record at or above it may or may not
be (it was appended after the capture, its change may have been applied
before). Replay is therefore idempotent: a seal already in the snapshot is a
no-op (the ledger and the data plane both accept an identical repeat). See
:mod:`rollvault.controller.snapshots.journal_replay`.

With ``rollout.prefix_resume`` on, the journal also holds ``partial`` records:
the output so far of turns still generating (:mod:`.partials`), appended the
same way; they change no ledger state, so a snapshot never reflects them, and
the partials of live attempts are journaled again before a rotation drops
their segments (:meth:`SealJournal.carry_partials`).

Records are msgpack (no pickle): a tagged union in a versioned envelope.
The journal's structs (records, row columns, :class:`StagedSeal`) are plain
data that never refer back to anything holding them, so they are not
tracked by the cyclic garbage collector (msgspec's ``gc=False``): a
generation batch's 128 seal records and staged seals, alive together on the
event loop until the batch record is encoded, otherwise pushed the
collector's young-generation count over its threshold about once more per
train step than the run without the journal. Row
arrays travel as raw bytes with their dtype (rows are 1-D, so the length is
the shape). A generation batch's seals are one ``seals`` record
(:class:`SealBatchRecord`, rows in columns, :mod:`.journal_rows`): replay
expands it into its seals, in order. On disk: ``<checkpoint_dir>/journal/segment_<first seq>.journal``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from rollvault.config.schema import JournalWriterPlacement, SealJournalConfig
from rollvault.controller.loop.journal_rows import (
    JournalRow,
    RowBlock,
    SealJournalRecordError,
    encode_rows,
    pack_rows,
    unpack_rows,
)
from rollvault.dataplane.rows import RowView
from rollvault.durable.journal_format import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    JournalReplay,
)
from rollvault.durable.journal_process import JournalProcessWriter
from rollvault.durable.journal_writer import JournalRepair, JournalWriteError, JournalWriter
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext

SEAL_JOURNAL_DIRNAME: Final = "journal"
SEAL_JOURNAL_SCHEMA_VERSION: Final = 1
PARTIAL_RECORD_SCHEMA_VERSION: Final = 2
"""The envelope version of a ``partial`` record (token-prefix resume): a rollvault that
reads version 1 only refuses it by its version, naming it, instead of failing on an
unknown tag; seals, finalizations and steps keep version 1, so a journal without
partials stays readable by it."""
SEAL_BATCH_RECORD_SCHEMA_VERSION: Final = 3
"""The envelope version of a ``seals`` record (a generation batch's seals in one record,
rows in columns): a rollvault that reads only the earlier versions refuses it by its
version, naming it."""
FINALIZE_BATCH_RECORD_SCHEMA_VERSION: Final = 4
"""The envelope version of a ``finalizes`` record (the finalizations since the journal's
previous record, in one record): refused by its version, naming it, by a rollvault that
reads only the earlier versions."""
MAX_HELD_FINALIZATIONS: Final = 1024
"""Most finalizations the journal holds before it appends them without waiting for the
next record (a bound on the record's size and on what a kill loses of the counts)."""
_LOG = logging.getLogger("rollvault.journal")
_ENCODE_ERRORS: Final = (msgspec.EncodeError, KeyError, TypeError, ValueError, OverflowError)
"""What packing or encoding a record may raise: a row or a value the journal cannot store."""


class JournalEncodeError(JournalWriteError):
    """A record could not be encoded (or is too large for a record): the journal stops, as
    on a failed write, so that no record is ever written after a missing one."""


_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class SealRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="seal"
):
    """One sealed sibling: what ``mark_sibling_sealed`` was given, and its staged rows."""

    group_id: str
    generation_index: _NonNegativeInt
    gate_rollout_id: str
    """Names the attempt (its UUID): replay seals only that very attempt (fencing)."""
    epoch: _NonNegativeInt
    dataset_idx: _NonNegativeInt
    target_step: int | None
    receipt: dict[str, Any]
    reward: float
    mask_sample: bool
    reward_checks: RewardChecks | None
    reward_log_context: RewardLogContext | None
    rows: dict[str, JournalRow]
    """The receipt's staging keys and their rows."""
    num_tokens: _NonNegativeInt
    """The gate's token count of the attempt (for the attempt log a replay writes)."""
    checks: dict[str, bool | float] | None
    adopted_from: str | None = None
    """A seal a restore adopted: the attempt that generated the tokens (for the log)."""

    @property
    def attempt_hex(self) -> str:
        return self.gate_rollout_id.rsplit("_a", 1)[1]


class FinalizeRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="finalize"
):
    """A group the finalizer published and indexed for training."""

    group_id: str
    target_step: int | None
    gate_rollout_ids: list[str]
    """Per sibling, the attempt whose rows were published."""


class StepRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="step"
):
    """A train step boundary: the trainer version after it and the groups it trained."""

    trainer_version: _NonNegativeInt
    group_ids: list[str]


class PartialRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="partial"
):
    """A turn in flight's output so far (``rollout.prefix_resume``): cumulative, so the newest
    record of an attempt's turn is all a restore needs."""

    group_id: str
    generation_index: _NonNegativeInt
    gate_rollout_id: str
    """The attempt that generated it: replay gives it only to that attempt's sibling while
    that attempt is still its current one (fencing)."""
    epoch: _NonNegativeInt
    dataset_idx: _NonNegativeInt
    """The prompt: a partial of a group a restore lost goes to the prompt's next group."""
    target_step: int | None
    turn_index: _NonNegativeInt
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    seed_id: str
    """What seeds the turn's chunks (``PartialTurn.seed_id``)."""

    @property
    def attempt_hex(self) -> str:
        return self.gate_rollout_id.rsplit("_a", 1)[1]


class SealBatchRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="seals"
):
    """A generation batch's seals in one record, their rows in columns
    (:func:`~rollvault.controller.loop.journal_rows.pack_rows`).

    One record instead of one per seal: packing takes a few C calls per field
    instead of a Struct and a copy per array, and the writer frames and
    checksums one payload. The seals are applied in
    order on replay, exactly as if each had its own record (:func:`decode_replay`
    expands them); they become durable together.
    """

    seals: list[SealRecord]
    """The seals in the order they were applied, each with ``rows`` empty."""
    row_counts: list[_NonNegativeInt]
    """How many of the batch's rows each seal has (its staging keys)."""
    keys: list[str]
    """Every row's staging key, seal by seal, in each receipt's order."""
    blocks: list[RowBlock]

    def expanded(self, *, where: str) -> list[SealRecord]:
        """The seals with their rows, as :class:`SealRecord` s of their own would hold them."""
        if len(self.row_counts) != len(self.seals) or sum(self.row_counts) != len(self.keys):
            raise SealJournalRecordError(
                f"{where}: {len(self.seals)} seals, {len(self.row_counts)} row counts summing "
                f"to {sum(self.row_counts)}, {len(self.keys)} staging keys"
            )
        rows = unpack_rows(self.blocks, len(self.keys), where=where)
        seals = []
        start = 0
        for number, (seal, count) in enumerate(zip(self.seals, self.row_counts, strict=True)):
            if seal.rows:
                raise SealJournalRecordError(
                    f"{where}: seal {number} ({seal.gate_rollout_id}) carries rows of its own"
                )
            end = start + count
            own = dict(zip(self.keys[start:end], rows[start:end], strict=True))
            if len(own) != count:
                raise SealJournalRecordError(
                    f"{where}: seal {number} ({seal.gate_rollout_id}) names a staging key twice"
                )
            seals.append(msgspec.structs.replace(seal, rows=own))
            start = end
        return seals


class FinalizeBatchRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False, tag="finalizes"
):
    """The groups finalized since the journal's previous record, in the order they were.

    The finalizer publishes a group at a time (16 per train step on the GRPO
    recipe): a record each cost the event loop an encode and a hand-over to the
    writer each, for records that replay only counts. The journal holds them
    and appends them as one record just before its next record (a seal batch, a
    step, a partial), at a rotation and at the close: the journal's order is the
    order the changes were applied in, as before.
    """

    finalizations: list[FinalizeRecord]

    def expanded(self, *, where: str) -> list[FinalizeRecord]:
        """The finalizations, as records of their own would hold them."""
        if not self.finalizations:
            raise SealJournalRecordError(f"{where}: a finalizes record holds no finalization")
        return self.finalizations


ReplayEntry = SealRecord | FinalizeRecord | StepRecord | PartialRecord
"""What a replay applies: a batch record is expanded into its entries (:func:`decode_replay`)."""
JournalEntry = ReplayEntry | SealBatchRecord | FinalizeBatchRecord


class StagedSeal(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A seal handed to the journal with its rows as they were staged, not yet encoded.

    The journal packs the rows of a batch of them in columns
    (:func:`seal_batch_record`), or a lone one's rows one by one
    (:meth:`journaled`), so the hot path copies no row into a record of its
    own first. The rows are the turn rows the gate handed to the pump's turn
    sink, or rows read back from the data plane.
    """

    record: SealRecord
    """The seal, its ``rows`` left empty."""
    rows: Mapping[str, RowView]
    keys: list[str]
    """The receipt's staging keys, in its order: the rows journaled."""

    def journaled(self) -> SealRecord:
        """The record as journaled: with its rows encoded."""
        return msgspec.structs.replace(self.record, rows=encode_rows(self.rows, self.keys))


def seal_batch_record(staged: Sequence[StagedSeal]) -> SealBatchRecord:
    """A generation batch's staged seals as one record, every row packed in columns.

    Built and encoded on the event loop, where the rows were just made: packing
    is per-field work on every row, which costs about twice as much on the
    writer thread after it slept (cold caches), and a GIL-bound thread's time
    delays the loop either way. What is left for the writer is bulk bytes:
    framing, CRC, write, fsync.
    """
    return SealBatchRecord(
        seals=[seal.record for seal in staged],
        row_counts=[len(seal.keys) for seal in staged],
        keys=[key for seal in staged for key in seal.keys],
        blocks=pack_rows([seal.rows[key] for seal in staged for key in seal.keys]),
    )


def _seal_payloads(entries: Sequence[SealRecord | StagedSeal]) -> list[bytes]:
    """The encoded records of a batch of seals: one batch record when two or more are
    staged, else a record each (raises what packing or encoding raises)."""
    staged = [entry for entry in entries if isinstance(entry, StagedSeal)]
    if len(entries) > 1 and len(staged) == len(entries):
        return [encode_entry(seal_batch_record(staged))]
    return [
        encode_entry(entry.journaled() if isinstance(entry, StagedSeal) else entry)
        for entry in entries
    ]


class JournalEnvelope(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False
):
    """What one journal record's payload holds."""

    schema_version: int
    entry: JournalEntry


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A verified record, decoded, with where it is on disk (for messages)."""

    seq: int
    """The record's seq (the seals of one batch record share it)."""
    entry: ReplayEntry
    segment: Path
    offset: int


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(JournalEnvelope)


def _schema_version(entry: JournalEntry) -> int:
    if isinstance(entry, PartialRecord):
        return PARTIAL_RECORD_SCHEMA_VERSION
    if isinstance(entry, SealBatchRecord):
        return SEAL_BATCH_RECORD_SCHEMA_VERSION
    if isinstance(entry, FinalizeBatchRecord):
        return FINALIZE_BATCH_RECORD_SCHEMA_VERSION
    return SEAL_JOURNAL_SCHEMA_VERSION


def _envelope(entry: JournalEntry) -> JournalEnvelope:
    return JournalEnvelope(schema_version=_schema_version(entry), entry=entry)


def encode_entry(entry: JournalEntry) -> bytes:
    """The payload of one journal record."""
    return _ENCODER.encode(_envelope(entry))


def decode_entry(payload: bytes, *, where: str) -> JournalEntry:
    """Decode one payload; ``where`` (segment and offset) is named in the error."""
    try:
        envelope = _DECODER.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SealJournalRecordError(f"{where}: not a seal journal record: {exc}") from exc
    expected = _schema_version(envelope.entry)
    if envelope.schema_version != expected:
        raise SealJournalRecordError(
            f"{where}: seal journal schema_version {envelope.schema_version} for a "
            f"{type(envelope.entry).__name__}; this rollvault reads version {expected} for it"
        )
    return envelope.entry


def decode_replay(replay: JournalReplay) -> list[DecodedRecord]:
    """Every verified record of ``replay``, decoded, in order (raises on a bad one).

    A batch record gives its seals (or finalizations) in order, each a record of
    its own with the batch's seq and place on disk.
    """
    decoded: list[DecodedRecord] = []
    for scan in replay.segments:
        offset = SEGMENT_HEADER_BYTES
        for record in scan.records:
            where = f"{scan.path} at byte {offset} (record {record.seq})"
            entry = decode_entry(record.payload, where=where)
            entries: Sequence[ReplayEntry] = (
                entry.expanded(where=where)
                if isinstance(entry, SealBatchRecord | FinalizeBatchRecord)
                else [entry]
            )
            decoded.extend(DecodedRecord(record.seq, one, scan.path, offset) for one in entries)
            offset += RECORD_HEADER_BYTES + len(record.payload)
    return decoded


@dataclass
class SealJournalCounters:
    """What the journal did in this start, for the run's metrics."""

    seals_journaled: int = 0
    finalizations_journaled: int = 0
    steps_journaled: int = 0
    partials_journaled: int = 0
    partials_carried: int = 0
    """Partials of live attempts journaled again past a snapshot, so its rotation keeps them."""
    rotations: int = 0
    segments_dropped: int = 0


class SealJournal:
    """The run's seal journal: encodes records and hands their bytes to its writer."""

    def __init__(self, writer: JournalWriter | JournalProcessWriter, repair: JournalRepair) -> None:
        self._writer = writer
        self.repair = repair
        """What opening found and cut off (a torn tail, quarantined segments): restore reports it."""
        self.counters = SealJournalCounters()
        self._seal_seqs: deque[tuple[int, int]] = deque()
        """(seq, seals it holds) of each seal record not yet counted as kept."""
        self._seals_kept = 0
        self._held_finalizations: list[FinalizeRecord] = []
        """Finalizations not yet appended: they go just before the next record (see
        :class:`FinalizeBatchRecord`)."""
        self.failure: JournalWriteError | None = None
        """Why the journal stopped taking records (None: it takes them)."""
        self.bytes_appended = sum(
            len(record.payload) for scan in repair.replay.segments for record in scan.records
        )
        """Payload bytes in the journal: those it held when it opened (a restart's journal
        is not covered by a snapshot of this start yet; counting it keeps runs killed
        more often than the snapshot interval from growing it without end) and those
        queued since (what a replay reads, headers aside)."""
        self.covered_bytes = 0
        """``bytes_appended`` when the newest committed snapshot (or trainer checkpoint) was
        captured: what a restore from it would replay is about the difference."""
        self._capture_bytes: dict[int, int] = {}
        """``bytes_appended`` at each seq a snapshot capture took (:meth:`snapshot_seq`)."""
        self._growth_alarm: tuple[int, Callable[[], None]] | None = None

    @classmethod
    def open(cls, checkpoint_dir: Path, settings: SealJournalConfig) -> SealJournal:
        """Repair ``<checkpoint_dir>/journal`` and start writing after its last good record."""
        opener = (
            JournalProcessWriter.open
            if settings.writer is JournalWriterPlacement.PROCESS
            else JournalWriter.open
        )
        writer, repair = opener(
            checkpoint_dir / SEAL_JOURNAL_DIRNAME,
            commit_interval_s=settings.commit_interval_ms / 1000.0,
            commit_max_records=settings.max_batch_records,
            lazy_interval_s=settings.lazy_interval_ms / 1000.0,
        )
        if repair.truncated is not None:
            _LOG.warning("seal journal: cut off a damaged tail: %s", repair.truncated.describe())
        for path in repair.quarantined:
            _LOG.warning("seal journal: quarantined %s (after the damage, never replayed)", path)
        return cls(writer, repair)

    @property
    def next_seq(self) -> int:
        """The seq the next record gets."""
        return self._writer.stats().appended_seq + 1

    def snapshot_seq(self) -> int:
        """The seq a snapshot taken now records (inside the cut): it reflects every record
        below it. The held finalizations are appended first, since the snapshot
        reflects them too (a restore from it then does not count them as after it)."""
        self._append_all([], lazy=True)
        seq = self.next_seq
        self._capture_bytes[seq] = self.bytes_appended
        return seq

    def set_growth_alarm(self, at_bytes: int, alarm: Callable[[], None]) -> None:
        """Call ``alarm`` after each append that leaves :attr:`bytes_appended` at or over
        ``at_bytes``, and when the journal stops taking records (its seals are then kept
        only by snapshots again). On the event loop, where records are appended; the
        checkpointer owns it, sets it again as it goes and clears it when it stops."""
        self._growth_alarm = (at_bytes, alarm)

    def clear_growth_alarm(self) -> None:
        self._growth_alarm = None

    def covering(self, snapshot_seq: int) -> None:
        """A snapshot captured at ``snapshot_seq`` committed: :attr:`covered_bytes` is what
        was journaled by its capture (on the event loop, before :meth:`covered` rotates
        in a worker thread)."""
        self.covered_bytes = self._capture_bytes.get(snapshot_seq, self.covered_bytes)
        for seq in [seq for seq in self._capture_bytes if seq <= snapshot_seq]:
            del self._capture_bytes[seq]

    def seal(self, entry: SealRecord | StagedSeal) -> int | None:
        """Journal one applied seal (the caller built it from what it handed the ledger).

        The caller passes the rows it staged (a :class:`StagedSeal`), so the hot
        path reads neither the ledger's group nor the data plane back.
        """
        seqs = self.seal_many([entry])
        return None if seqs is None else seqs[0]

    def seal_many(self, entries: list[SealRecord | StagedSeal]) -> range | None:
        """Journal a batch of applied seals, in order, as :meth:`seal` does each.

        Two or more staged seals go in one :class:`SealBatchRecord` (one seq,
        durable together); otherwise each seal is a record of its own. Returns
        the seqs of the records, or None once the journal has stopped.
        """
        if self.failure is not None:
            return None
        if not entries:
            return range(self.next_seq, self.next_seq)
        try:
            payloads = _seal_payloads(entries)
        except _ENCODE_ERRORS as exc:
            # A row the journal cannot store (a dtype rows may not have): the journal
            # stops, and the run goes on with its snapshots; no later record is written
            # after the missing ones.
            first = entries[0].record if isinstance(entries[0], StagedSeal) else entries[0]
            self._stopped(
                JournalEncodeError(
                    f"journal {self._writer.directory}: {len(entries)} seal(s) from "
                    f"{first.gate_rollout_id} could not be encoded: {exc!r}"
                )
            )
            return None
        seqs = self._append_all(payloads)
        if seqs is not None:
            self.counters.seals_journaled += len(entries)
            per_record = len(entries) // len(seqs)
            self._seal_seqs.extend((seq, per_record) for seq in seqs)
        return seqs

    def finalized(
        self, group_id: str, *, target_step: int | None, gate_rollout_ids: list[str]
    ) -> None:
        """Journal a published group: held, and appended just before the journal's next
        record (at the latest the train step's), at a rotation or at the close."""
        if self.failure is not None:
            return
        self._held_finalizations.append(
            FinalizeRecord(
                group_id=group_id, target_step=target_step, gate_rollout_ids=list(gate_rollout_ids)
            )
        )
        self.counters.finalizations_journaled += 1
        if len(self._held_finalizations) >= MAX_HELD_FINALIZATIONS:
            self._append_all([], lazy=True)

    def step(self, trainer_version: int, group_ids: list[str]) -> int | None:
        """Journal a train step boundary."""
        self.counters.steps_journaled += 1
        step = StepRecord(trainer_version=trainer_version, group_ids=list(group_ids))
        return self._append(step, lazy=True)  # rides on the next group: see the module doc

    def partial(self, record: PartialRecord) -> int | None:
        """Journal a turn's partial output (appended only: no waiting for the disk)."""
        self.counters.partials_journaled += 1
        return self._append(record)

    def carry_partials(self, records: list[PartialRecord]) -> None:
        """Journal ``records`` again, before a snapshot's :meth:`covered` drops the segments
        that held them: the snapshot does not hold partials (they are outside the cut),
        and these attempts are still generating. Call before ``covered``, whose rotation
        flushes them to disk before any segment goes."""
        for record in records:
            if self._append(record) is not None:
                self.counters.partials_carried += 1

    def _append(self, entry: JournalEntry, *, lazy: bool = False) -> int | None:
        """Encode and queue one record; None once the journal has stopped. ``lazy``: see the
        module doc."""
        if self.failure is not None:
            return None
        try:
            payload = encode_entry(entry)
        except _ENCODE_ERRORS as exc:
            self._stopped(
                JournalEncodeError(
                    f"journal {self._writer.directory}: a {type(entry).__name__} record could "
                    f"not be encoded: {exc!r}"
                )
            )
            return None
        seqs = self._append_all([payload], lazy=lazy)
        return None if seqs is None else seqs[0]

    def _append_all(self, payloads: list[bytes], *, lazy: bool = False) -> range | None:
        """Queue encoded records in order; their seqs, None once the journal has stopped.

        A journal that cannot write (disk full, I/O error) does not stop the
        run: snapshots still keep everything up to the newest one, as before
        the journal existed. The failure is logged once and the metrics show
        ``journal/failed``.
        """
        if self.failure is not None:
            return None
        held = self._held_payloads()
        if held is None:
            return None
        try:
            # Encoded here, on the event loop, right after the records were built (warm,
            # and they die at once instead of living in the queue for a commit interval,
            # where the collector would walk them); the writer gets bytes.
            seqs = self._writer.append_many([*held, *payloads], lazy=lazy)
        except ValueError as error:  # a record larger than a record may be
            self._stopped(JournalEncodeError(str(error)))
            return None
        except JournalWriteError as error:
            self._stopped(error)
            return None
        self.bytes_appended += sum(map(len, held)) + sum(map(len, payloads))
        alarm = self._growth_alarm
        if alarm is not None and self.bytes_appended >= alarm[0]:
            alarm[1]()
        return range(seqs.start + len(held), seqs.stop)

    def _held_payloads(self) -> list[bytes] | None:
        """The held finalizations as one record's payload (none held: no payload); None
        once the journal has stopped (they could not be encoded)."""
        held = self._held_finalizations
        if not held:
            return []
        self._held_finalizations = []
        entry = held[0] if len(held) == 1 else FinalizeBatchRecord(finalizations=held)
        try:
            return [encode_entry(entry)]
        except _ENCODE_ERRORS as exc:
            self._stopped(
                JournalEncodeError(
                    f"journal {self._writer.directory}: {len(held)} finalization(s) from "
                    f"{held[0].group_id} could not be encoded: {exc!r}"
                )
            )
            return None

    def _stopped(self, error: JournalWriteError) -> None:
        self.failure = error
        _LOG.warning(
            "seal journal stopped: %s; seals are kept only up to the newest snapshot now", error
        )
        if self._growth_alarm is not None:
            self._growth_alarm[1]()

    def covered(self, snapshot_seq: int) -> None:
        """A committed snapshot reflects every record below ``snapshot_seq``: rotate, drop.

        Blocking (the rotation waits for the writer's flush): call it
        in a worker thread. Only what the newest snapshot covers goes; a
        restore that falls back to an older snapshot replays what is left
        (seals whose records went are then generated again, never wrongly
        applied: replay is fenced by attempt id).
        """
        self._writer.rotate()
        self.counters.rotations += 1
        dropped = self._writer.drop_through(snapshot_seq - 1)
        self.counters.segments_dropped += len(dropped)

    async def until_durable(self, seq: int) -> None:
        """Wait until record ``seq`` is on disk."""
        await self._writer.until_durable(seq)

    def metrics(self) -> dict[str, float]:
        """The journal's counters for the run's step metrics (``journal/...``)."""
        stats = self._writer.stats()
        while self._seal_seqs and self._seal_seqs[0][0] <= stats.durable_seq:
            self._seals_kept += self._seal_seqs.popleft()[1]
        counters = self.counters
        return {
            "journal/durable_seq": float(stats.durable_seq),
            "journal/lag_records": float(stats.appended_seq - stats.durable_seq),
            "journal/seals_journaled": float(counters.seals_journaled),
            "journal/seals_kept": float(self._seals_kept),
            "journal/finalizations": float(counters.finalizations_journaled),
            "journal/steps": float(counters.steps_journaled),
            "journal/partials": float(counters.partials_journaled),
            "journal/partials_carried": float(counters.partials_carried),
            "journal/fsyncs": float(stats.fsyncs),
            "journal/bytes_written": float(stats.bytes_written),
            "journal/rotations": float(counters.rotations),
            "journal/failed": float(self.failure is not None),
        }

    def close(self) -> None:
        """Append the held finalizations, flush what is queued and stop the writer
        (from the thread that journals, or once it journals no more: :meth:`aclose`).

        A writer that failed does not fail the close, for the reason a failed
        append does not fail the run (:meth:`_append`): the failure is logged
        once, and whatever ended the run (a full disk stops it through the
        snapshots) is what the run reports.
        """
        self._append_all([], lazy=True)
        try:
            self._writer.close()
        except JournalWriteError as error:
            if self.failure is None:
                self._stopped(error)

    async def aclose(self) -> None:
        # The held finalizations are the event loop's: queued here, not on the thread.
        self._append_all([], lazy=True)
        await asyncio.to_thread(self.close)
