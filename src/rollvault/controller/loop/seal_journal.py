"""The seal journal: every seal, finalization and train step since the newest snapshot.

Snapshots are seconds apart; without the journal everything sealed since the
last one is generated again after a kill. The rollout pump, the finalizer and
the train pump hand a record of each applied change to a
:class:`~rollvault.durable.journal_writer.JournalWriter` (CRC-framed
segments, group commit on a writer thread, :mod:`rollvault.durable`), *after*
the change was applied and *outside* the mutation cut: appending costs a
queue put; the writer thread encodes each group of records into one buffer
(:func:`entry_encoder`), writes it and flushes it with one ``fsync``, once per
``rollout_checkpointing.journal.commit_interval_ms`` (or per
``max_batch_records``). A seal is *kept* once its record is durable.

What is durable when: a seal (and a partial) record opens a group commit, so it
is durable within about the commit interval. Finalize and step records are
appended *lazily* (:meth:`~rollvault.durable.journal_writer.JournalWriter.append_object`
with ``lazy=True``): they open no group of their own but ride on the next one
(the next generation batch's seals), a rotation or the close, or are flushed
alone after ``JournalWriter``'s lazy interval (1 s). Nothing depends on them
being durable sooner: replay only counts them (a restore rolls the trainer
back to the snapshot's trainer checkpoint and finalizes the replayed groups
again, :mod:`~rollvault.controller.snapshots.journal_replay`), no caller waits
for them, and the journal stays a prefix in sequence order, so a lazy record
never lets a later seal become durable before it. This saves the ``fsync``
each of them started (about two per train step on the GRPO recipe).

Consistency with snapshots: a snapshot records :attr:`SealJournal.next_seq`
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

Records are msgpack (no pickle): a tagged union in a versioned envelope. Row
arrays travel as raw bytes with their dtype (rows are 1-D, so the length is
the shape). On disk: ``<checkpoint_dir>/journal/segment_<first seq>.journal``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
import numpy as np

from rollvault.config.schema import SealJournalConfig
from rollvault.dataplane.rows import Row, RowDtype, RowView, row_dtype
from rollvault.durable.journal_format import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    JournalReplay,
)
from rollvault.durable.journal_writer import (
    JournalRepair,
    JournalWriteError,
    JournalWriter,
    PayloadEncoder,
)
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext

SEAL_JOURNAL_DIRNAME: Final = "journal"
SEAL_JOURNAL_SCHEMA_VERSION: Final = 1
PARTIAL_RECORD_SCHEMA_VERSION: Final = 2
"""The envelope version of a ``partial`` record (token-prefix resume): a rollvault that
reads version 1 only refuses it by its version, naming it, instead of failing on an
unknown tag; seals, finalizations and steps keep version 1, so a journal without
partials stays readable by it."""
_LOG = logging.getLogger("rollvault.journal")

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class JournalArray(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A 1-D row array: its dtype and its raw little-endian bytes."""

    dtype: RowDtype
    data: bytes


JournalValue = JournalArray | bool | int | float
JournalRow = dict[str, JournalValue]


class SealRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="seal"):
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
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="finalize"
):
    """A group the finalizer published and indexed for training."""

    group_id: str
    target_step: int | None
    gate_rollout_ids: list[str]
    """Per sibling, the attempt whose rows were published."""


class StepRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="step"):
    """A train step boundary: the trainer version after it and the groups it trained."""

    trainer_version: _NonNegativeInt
    group_ids: list[str]


class PartialRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="partial"
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


JournalEntry = SealRecord | FinalizeRecord | StepRecord | PartialRecord


@dataclass(frozen=True, slots=True)
class StagedSeal:
    """A seal handed to the writer with its rows as they were staged, not yet encoded.

    Copying the rows' arrays out as journal values (:func:`encode_rows`) is the
    costliest part of a record; done on the writer thread, it stays off the event
    loop (on a train step's critical path). The rows must not change once handed
    over: they are the turn rows the gate handed to the pump's turn sink, which it
    never touches again (the data plane stores its own copies), or rows read back
    from the data plane. The bytes on disk are those of the :class:`SealRecord`
    :meth:`journaled` returns.
    """

    record: SealRecord
    """The seal, its ``rows`` left empty."""
    rows: Mapping[str, RowView]
    keys: list[str]
    """The receipt's staging keys, in its order: the rows journaled."""

    def journaled(self) -> SealRecord:
        """The record as journaled: with its rows encoded."""
        return msgspec.structs.replace(self.record, rows=encode_rows(self.rows, self.keys))


class JournalEnvelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one journal record's payload holds."""

    schema_version: int
    entry: JournalEntry


class SealJournalRecordError(ValueError):
    """A journal record passed its CRC but is not a record this rollvault reads."""


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A verified record, decoded, with where it is on disk (for messages)."""

    seq: int
    entry: JournalEntry
    segment: Path
    offset: int


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(JournalEnvelope)


def _envelope(entry: JournalEntry) -> JournalEnvelope:
    version = (
        PARTIAL_RECORD_SCHEMA_VERSION
        if isinstance(entry, PartialRecord)
        else SEAL_JOURNAL_SCHEMA_VERSION
    )
    return JournalEnvelope(schema_version=version, entry=entry)


def encode_entry(entry: JournalEntry) -> bytes:
    """The payload of one journal record."""
    return _ENCODER.encode(_envelope(entry))


def entry_encoder() -> PayloadEncoder:
    """The writer thread's encoder: one record's payload appended to the group's buffer.

    Its own msgspec encoder (one per writer, used by that writer's thread only);
    the bytes are those of :func:`encode_entry`.
    """
    encoder = msgspec.msgpack.Encoder()
    entry_types = (SealRecord, FinalizeRecord, StepRecord, PartialRecord)

    def encode_into(entry: object, buffer: bytearray) -> None:
        if isinstance(entry, StagedSeal):
            entry = entry.journaled()
        if not isinstance(entry, entry_types):
            raise TypeError(f"not a seal journal entry: {type(entry).__name__}")
        encoder.encode_into(_envelope(entry), buffer, -1)

    return encode_into


def decode_entry(payload: bytes, *, where: str) -> JournalEntry:
    """Decode one payload; ``where`` (segment and offset) is named in the error."""
    try:
        envelope = _DECODER.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SealJournalRecordError(f"{where}: not a seal journal record: {exc}") from exc
    expected = (
        PARTIAL_RECORD_SCHEMA_VERSION
        if isinstance(envelope.entry, PartialRecord)
        else SEAL_JOURNAL_SCHEMA_VERSION
    )
    if envelope.schema_version != expected:
        raise SealJournalRecordError(
            f"{where}: seal journal schema_version {envelope.schema_version} for a "
            f"{type(envelope.entry).__name__}; this rollvault reads version {expected} for it"
        )
    return envelope.entry


def decode_replay(replay: JournalReplay) -> list[DecodedRecord]:
    """Every verified record of ``replay``, decoded, in order (raises on a bad one)."""
    decoded = []
    for scan in replay.segments:
        offset = SEGMENT_HEADER_BYTES
        for record in scan.records:
            where = f"{scan.path} at byte {offset} (record {record.seq})"
            entry = decode_entry(record.payload, where=where)
            decoded.append(DecodedRecord(record.seq, entry, scan.path, offset))
            offset += RECORD_HEADER_BYTES + len(record.payload)
    return decoded


_LITTLE_ENDIAN_HOST: Final = sys.byteorder == "little"


def encode_row(row: RowView) -> JournalRow:
    """A stored row as journal values (arrays as dtype + bytes)."""
    out: JournalRow = {}
    for name, value in row.items():
        if isinstance(value, np.ndarray):
            # Little-endian on disk: a native array on a little-endian host is copied
            # out as it is (no byte-order dtype built per array: this is the seal path).
            if _LITTLE_ENDIAN_HOST and value.dtype.isnative:
                data = value.tobytes()
            else:
                data = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
            out[name] = JournalArray(dtype=row_dtype(value), data=data)
        elif isinstance(value, np.generic):
            # A gate's own row (not yet the data plane's stored form) may hold numpy scalars.
            out[name] = value.item()
        else:
            out[name] = value
    return out


def encode_rows(rows: Mapping[str, RowView], keys: list[str]) -> dict[str, JournalRow]:
    """The journal rows of ``keys`` (a receipt's staging keys, in its order)."""
    return {key: encode_row(rows[key]) for key in keys}


def decode_row(row: Mapping[str, JournalValue], *, where: str) -> Row:
    """The row a journal row describes; arrays whose bytes do not fit their dtype are refused."""
    out: Row = {}
    for name, value in row.items():
        if isinstance(value, JournalArray):
            dtype = np.dtype(value.dtype.value).newbyteorder("<")
            if len(value.data) % dtype.itemsize:
                raise SealJournalRecordError(
                    f"{where}: field {name!r}: {len(value.data)} bytes are not a whole number "
                    f"of {value.dtype.value} values"
                )
            # The data plane copies what it stores, so a read-only view suffices here.
            array = np.frombuffer(value.data, dtype=dtype)
            out[name] = array.astype(dtype.newbyteorder("="), copy=False)
        else:
            out[name] = value
    return out


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
    """The run's seal journal: encodes records and hands them to the writer thread."""

    def __init__(self, writer: JournalWriter, repair: JournalRepair) -> None:
        self._writer = writer
        self.repair = repair
        """What opening found and cut off (a torn tail, quarantined segments): restore reports it."""
        self.counters = SealJournalCounters()
        self._seal_seqs: deque[int] = deque()
        self._seals_kept = 0
        self.failure: JournalWriteError | None = None
        """Why the journal stopped taking records (None: it takes them)."""

    @classmethod
    def open(cls, checkpoint_dir: Path, settings: SealJournalConfig) -> SealJournal:
        """Repair ``<checkpoint_dir>/journal`` and start writing after its last good record."""
        writer, repair = JournalWriter.open(
            checkpoint_dir / SEAL_JOURNAL_DIRNAME,
            commit_interval_s=settings.commit_interval_ms / 1000.0,
            commit_max_records=settings.max_batch_records,
            encode=entry_encoder(),
        )
        if repair.truncated is not None:
            _LOG.warning("seal journal: cut off a damaged tail: %s", repair.truncated.describe())
        for path in repair.quarantined:
            _LOG.warning("seal journal: quarantined %s (after the damage, never replayed)", path)
        return cls(writer, repair)

    @property
    def next_seq(self) -> int:
        """The seq the next record gets; a snapshot taken now reflects every record below it."""
        return self._writer.stats().appended_seq + 1

    def seal(self, entry: SealRecord | StagedSeal) -> int | None:
        """Journal one applied seal (the caller built it from what it handed the ledger).

        The caller passes the rows it staged (a :class:`StagedSeal`: the writer
        thread encodes them), so the hot path reads neither the ledger's group nor
        the data plane back.
        """
        seqs = self.seal_many([entry])
        return None if seqs is None else seqs[0]

    def seal_many(self, entries: list[SealRecord | StagedSeal]) -> range | None:
        """Journal a batch of applied seals, in order, as :meth:`seal` does each (one
        queue put for the batch); their seqs, or None once the writer has failed."""
        seqs = self._append_all(entries)
        if seqs is not None:
            self.counters.seals_journaled += len(seqs)
            self._seal_seqs.extend(seqs)
        return seqs

    def finalized(
        self, group_id: str, *, target_step: int | None, gate_rollout_ids: list[str]
    ) -> int | None:
        """Journal a published group."""
        entry = FinalizeRecord(
            group_id=group_id, target_step=target_step, gate_rollout_ids=list(gate_rollout_ids)
        )
        self.counters.finalizations_journaled += 1
        return self._append(entry, lazy=True)  # rides on the next group: see the module doc

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
        """Queue one record; None once the writer has failed. ``lazy``: see the module doc."""
        seqs = self._append_all([entry], lazy=lazy)
        return None if seqs is None else seqs[0]

    def _append_all(
        self, entries: list[SealRecord | StagedSeal] | list[JournalEntry], *, lazy: bool = False
    ) -> range | None:
        """Queue records in order; their seqs, None once the writer has failed.

        A journal that cannot write (disk full, I/O error) does not stop the
        run: snapshots still keep everything up to the newest one, as before
        the journal existed. The failure is logged once and the metrics show
        ``journal/failed``.
        """
        if self.failure is not None:
            return None
        try:
            # Encoded on the writer thread, into its group's one buffer: the event
            # loop pays a queue put. Entries are frozen, and what they hold (staged
            # rows, copied lists, a receipt the ledger copied for itself) is never
            # changed once handed over.
            return self._writer.append_objects(entries, lazy=lazy)
        except JournalWriteError as error:
            self._stopped(error)
            return None

    def _stopped(self, error: JournalWriteError) -> None:
        self.failure = error
        _LOG.warning(
            "seal journal stopped: %s; seals are kept only up to the newest snapshot now", error
        )

    def covered(self, snapshot_seq: int) -> None:
        """A committed snapshot reflects every record below ``snapshot_seq``: rotate, drop.

        Blocking (the rotation waits for the writer thread's flush): call it
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
        while self._seal_seqs and self._seal_seqs[0] <= stats.durable_seq:
            self._seal_seqs.popleft()
            self._seals_kept += 1
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
        """Flush what is queued and stop the writer thread.

        A writer that failed does not fail the close, for the reason a failed
        append does not fail the run (:meth:`_append`): the failure is logged
        once, and whatever ended the run (a full disk stops it through the
        snapshots) is what the run reports.
        """
        try:
            self._writer.close()
        except JournalWriteError as error:
            if self.failure is None:
                self._stopped(error)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
