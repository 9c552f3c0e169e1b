"""The seal journal's records: codec round trip, refusals, and the writer wiring."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from rollvault.config.schema import JournalWriterPlacement, SealJournalConfig
from rollvault.controller.loop.journal_rows import (
    JournalArray,
    SealJournalRecordError,
    decode_row,
    encode_row,
    encode_rows,
)
from rollvault.controller.loop.seal_journal import (
    MAX_HELD_FINALIZATIONS,
    SEAL_JOURNAL_DIRNAME,
    FinalizeBatchRecord,
    FinalizeRecord,
    JournalEncodeError,
    JournalEntry,
    JournalEnvelope,
    SealBatchRecord,
    SealJournal,
    SealRecord,
    StagedSeal,
    StepRecord,
    decode_entry,
    decode_replay,
    encode_entry,
    seal_batch_record,
)
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.dataplane.rows import RowDtype, row_difference, validate_row
from rollvault.durable.journal_format import read_journal
from rollvault.durable.journal_writer import JournalWriteError, JournalWriter
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext

_PLACEMENTS = pytest.mark.parametrize("placement", list(JournalWriterPlacement))
"""The seal journal's contract holds whether its writer is a thread or a process."""


def _open_placed(tmp_path: Path, placement: JournalWriterPlacement) -> SealJournal:
    """A journal in ``tmp_path`` whose writer is at ``placement``, each seal flushed at once."""
    return SealJournal.open(tmp_path, SealJournalConfig(writer=placement, commit_interval_ms=0.0))


def _seal(rows: dict[str, dict[str, object]] | None = None) -> SealRecord:
    row = {
        "input_ids": np.arange(7, dtype=np.int64),
        "logprobs": np.linspace(-1.0, 0.0, 7, dtype=np.float32),
        "token_mask": np.array([0, 0, 1, 1, 1, 1, 1], dtype=np.bool_),
        "reward": 0.5,
        "turn": 0,
        "done": True,
    }
    key = "g1_g2_a" + "ab" * 16 + "/0"
    return SealRecord(
        group_id="g1",
        generation_index=2,
        gate_rollout_id="g1_g2_a" + "ab" * 16,
        epoch=1,
        dataset_idx=17,
        target_step=3,
        receipt={"gate_rollout_id": "g1_g2_a" + "ab" * 16, "staging_keys": [key], "reward": 0.5},
        reward=0.5,
        mask_sample=False,
        reward_checks=RewardChecks(overlong=False, format_ok=True, finite_logprobs=True),
        reward_log_context=RewardLogContext(response_length=5, stop_reason="stop"),
        rows={key: encode_row(row)} if rows is None else rows,  # type: ignore[arg-type]
        num_tokens=5,
        checks={"correct": True, "score": 0.25},
    )


def test_every_record_kind_round_trips() -> None:
    for entry in (
        _seal(),
        FinalizeRecord(group_id="g1", target_step=None, gate_rollout_ids=["a", "b"]),
        StepRecord(trainer_version=4, group_ids=["g1", "g2"]),
    ):
        assert decode_entry(encode_entry(entry), where="test") == entry


def test_row_arrays_round_trip_with_dtype_and_values() -> None:
    seal = _seal()
    (row,) = seal.rows.values()
    decoded = decode_row(row, where="test")
    assert decoded["input_ids"].dtype == np.int64  # type: ignore[union-attr]
    assert decoded["input_ids"].tolist() == list(range(7))  # type: ignore[union-attr]
    assert decoded["logprobs"].dtype == np.float32  # type: ignore[union-attr]
    assert np.array_equal(decoded["token_mask"], [0, 0, 1, 1, 1, 1, 1])
    assert decoded["reward"] == 0.5 and decoded["turn"] == 0 and decoded["done"] is True


def test_a_gate_row_with_numpy_scalars_journals_as_its_stored_form() -> None:
    # The rollout pump journals the row the gate handed over, not the data plane's
    # stored copy: numpy scalars there must encode (and replay) as Python scalars.
    gate_row = {
        "input_ids": np.arange(4, dtype=np.int64),
        "finished": np.bool_(True),
        "turn_index": np.int64(0),
        "reward": np.float32(0.5),
    }
    stored = validate_row(STAGING_PARTITION, "k/0", gate_row)
    encoded = encode_rows({"k/0": gate_row, "other/0": {}}, ["k/0"])  # type: ignore[dict-item]
    assert list(encoded) == ["k/0"]
    payload = encode_entry(msgspec.structs.replace(_seal(), rows=encoded))
    entry = decode_entry(payload, where="test")
    assert isinstance(entry, SealRecord)
    decoded = decode_row(entry.rows["k/0"], where="test")
    assert row_difference(stored, validate_row(STAGING_PARTITION, "k/0", decoded)) is None
    assert type(decoded["finished"]) is bool and type(decoded["turn_index"]) is int


def test_an_array_whose_bytes_do_not_fit_its_dtype_is_refused_naming_field() -> None:
    row = {"input_ids": JournalArray(dtype=RowDtype.INT64, data=b"\x00" * 12)}
    with pytest.raises(SealJournalRecordError, match=r"seg at 9.*'input_ids'.*int64"):
        decode_row(row, where="seg at 9")


def test_an_unknown_schema_version_is_refused() -> None:
    payload = msgspec.msgpack.encode(JournalEnvelope(schema_version=99, entry=_seal()))
    with pytest.raises(SealJournalRecordError, match="schema_version 99"):
        decode_entry(payload, where="x")


def test_a_record_that_is_not_ours_is_refused_naming_segment_and_offset(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path, first_seq=0, commit_interval_s=0.0)
    writer.append(encode_entry(StepRecord(trainer_version=1, group_ids=[])))
    writer.append(b"\x93not a record")  # passes the CRC: written by the writer itself
    writer.close()
    replay = read_journal(tmp_path)
    assert replay.damage is None
    with pytest.raises(SealJournalRecordError, match=r"segment_0000000000000000\.journal at byte"):
        decode_replay(replay)


def test_decode_replay_names_where_each_record_is(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path, first_seq=5, commit_interval_s=0.0)
    writer.append(encode_entry(StepRecord(trainer_version=1, group_ids=[])))
    writer.append(encode_entry(_seal()))
    writer.close()
    records = decode_replay(read_journal(tmp_path))
    assert [r.seq for r in records] == [5, 6]
    assert records[0].offset < records[1].offset
    assert isinstance(records[1].entry, SealRecord)


@_PLACEMENTS
def test_a_torn_tail_is_cut_off_when_the_journal_opens(
    tmp_path: Path, placement: JournalWriterPlacement
) -> None:
    journal = _open_placed(tmp_path, placement)
    for version in range(3):
        journal.step(version, ["g"])
    journal.close()
    (segment,) = (tmp_path / SEAL_JOURNAL_DIRNAME).iterdir()
    data = segment.read_bytes()
    segment.write_bytes(data[:-3])  # the last record torn by a kill
    reopened = _open_placed(tmp_path, placement)
    try:
        assert reopened.repair.truncated is not None
        assert "torn" in reopened.repair.truncated.describe()
        kept = decode_replay(reopened.repair.replay)
        assert [r.seq for r in kept] == [0, 1]
        assert reopened.next_seq == 2  # the torn record's seq is written again, never skipped
    finally:
        reopened.close()


_EAGER = SealJournalConfig(commit_interval_ms=0.0, lazy_interval_ms=0.0)
"""Step records flushed at once: tests of what a flush does need not wait the lazy second."""


def _eager(placement: JournalWriterPlacement) -> SealJournalConfig:
    return msgspec.structs.replace(_EAGER, writer=placement)


def test_a_lazy_record_is_flushed_alone_after_the_configured_interval(tmp_path: Path) -> None:
    settings = SealJournalConfig(
        commit_interval_ms=0.0, lazy_interval_ms=50.0, writer=JournalWriterPlacement.THREAD
    )
    journal = SealJournal.open(tmp_path, settings)
    try:
        assert isinstance(journal._writer, JournalWriter)
        assert journal._writer._lazy_interval == 0.05
        seq = journal.step(1, [])
        assert seq is not None and journal._writer.wait_durable(seq, timeout=30)
        assert journal.metrics()["journal/fsyncs"] == 1  # alone: no seal opened a group
    finally:
        journal.close()


@_PLACEMENTS
def test_metrics_count_seals_kept_once_durable(
    tmp_path: Path, placement: JournalWriterPlacement
) -> None:
    journal = SealJournal.open(tmp_path, _eager(placement))
    try:
        seq = journal.step(1, [])
        assert seq is not None
        asyncio.run(journal.until_durable(seq))
        metrics = journal.metrics()
        assert metrics["journal/durable_seq"] == seq
        assert metrics["journal/steps"] == 1
        assert metrics["journal/fsyncs"] >= 1
        assert metrics["journal/failed"] == 0.0
    finally:
        journal.close()


@_PLACEMENTS
def test_finalize_and_step_records_ride_on_the_next_seal_s_group(
    tmp_path: Path, placement: JournalWriterPlacement
) -> None:
    journal = _open_placed(tmp_path, placement)
    writer = journal._writer
    try:
        journal.finalized("g0", target_step=3, gate_rollout_ids=["a"])
        step = journal.step(4, ["g0"])
        assert step == 1  # the held finalization went just before it, as record 0
        # Neither opens a group commit of its own (the lazy interval is far longer).
        assert not writer.wait_durable(step, timeout=0.2)
        seal = journal.seal(_seal())
        assert seal == step + 1
        asyncio.run(journal.until_durable(seal))
        metrics = journal.metrics()
        assert metrics["journal/fsyncs"] == 1 and metrics["journal/durable_seq"] == seal
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    kinds = [type(r.entry) for r in records]
    assert kinds == [FinalizeRecord, StepRecord, SealRecord]


@_PLACEMENTS
def test_covered_rotates_and_drops_only_segments_the_snapshot_covers(
    tmp_path: Path, placement: JournalWriterPlacement
) -> None:
    journal = _open_placed(tmp_path, placement)
    try:
        for version in range(3):
            journal.step(version, [])
        journal.covered(2)  # a snapshot reflects records 0 and 1, not 2
        directory = tmp_path / SEAL_JOURNAL_DIRNAME
        assert len(list(directory.iterdir())) == 2  # record 2's segment stays, plus the new one
        journal.step(3, [])
        journal.covered(4)
        assert [r.seq for r in decode_replay(read_journal(directory))] == []
        journal.step(4, [])
    finally:
        journal.close()
    assert [r.seq for r in decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))] == [4]


def test_a_journal_that_cannot_write_stops_without_stopping_the_run(tmp_path: Path) -> None:
    journal = SealJournal.open(tmp_path, _eager(JournalWriterPlacement.THREAD))
    writer = journal._writer
    assert isinstance(writer, JournalWriter)  # its descriptor is closed under it
    seq = journal.step(1, [])
    assert seq is not None and writer.wait_durable(seq, timeout=30)
    assert writer._fd is not None
    os.close(writer._fd)  # the next write fails, as a full or lost disk would make it
    lost = journal.step(2, [])
    assert lost is not None
    with pytest.raises(JournalWriteError):
        writer.wait_durable(lost, timeout=30)
    assert journal.step(3, []) is None  # refused from now on, without raising
    assert journal.failure is not None
    assert journal.metrics()["journal/failed"] == 1.0
    writer._fd = None
    journal.close()  # logged once already: the close does not raise it again
    assert journal.failure is not None


def test_a_failure_no_append_saw_is_recorded_by_the_close_not_raised(tmp_path: Path) -> None:
    # A full disk ends the run through the snapshots; the journal's close must not
    # replace that stop with its own error (it did: exit 1 and a traceback).
    journal = SealJournal.open(tmp_path, _eager(JournalWriterPlacement.THREAD))
    writer = journal._writer
    assert isinstance(writer, JournalWriter)  # its descriptor is closed under it
    assert writer._fd is not None
    os.close(writer._fd)
    lost = journal.step(1, [])
    assert lost is not None
    with pytest.raises(JournalWriteError):
        writer.wait_durable(lost, timeout=30)
    assert journal.failure is None  # no append came after the failure
    writer._fd = None
    journal.close()
    assert isinstance(journal.failure, JournalWriteError)
    assert journal.metrics()["journal/failed"] == 1.0


@_PLACEMENTS
def test_a_full_disk_stops_the_journal_and_keeps_every_durable_record(
    small_filesystem: Callable[[int], Path], placement: JournalWriterPlacement
) -> None:
    directory = small_filesystem(128 * 1024)
    journal = SealJournal.open(directory, _eager(placement))
    kept = journal.step(1, ["g"])
    assert kept is not None
    asyncio.run(journal.until_durable(kept))
    lost = journal.step(2, [f"group-{n:06d}" for n in range(20_000)])  # more than fits
    assert lost is not None
    with pytest.raises(JournalWriteError, match="No space left on device"):
        asyncio.run(journal.until_durable(lost))
    assert journal.step(3, []) is None  # refused from now on, without raising
    assert journal.failure is not None
    assert journal.metrics()["journal/failed"] == 1.0
    journal.close()  # logged once already: the close does not raise it again
    replay = read_journal(directory / SEAL_JOURNAL_DIRNAME)
    assert [r.seq for r in decode_replay(replay)] == [kept]


def test_the_writer_thread_encodes_each_entry_as_encode_entry_does(tmp_path: Path) -> None:
    # The journal hands entries over unencoded (the writer thread encodes them into
    # its group's buffer); what lands on disk must be the very bytes of encode_entry.
    seal = _seal()
    entries: list[JournalEntry] = [
        seal,
        FinalizeRecord(group_id="g1", target_step=3, gate_rollout_ids=["a"]),
        StepRecord(trainer_version=4, group_ids=["g1"]),
    ]
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=5.0))
    seal_seq = journal.seal(seal)
    journal.finalized("g1", target_step=3, gate_rollout_ids=["a"])
    last = journal.step(4, ["g1"])
    assert seal_seq == 0 and last == 2
    journal.close()
    records = read_journal(tmp_path / SEAL_JOURNAL_DIRNAME).records
    assert [r.payload for r in records] == [encode_entry(entry) for entry in entries]
    assert journal.metrics()["journal/seals_kept"] == 1.0


def test_a_staged_seal_s_rows_are_encoded_on_the_writer_thread_as_encode_rows_does(
    tmp_path: Path,
) -> None:
    # The pump hands a seal over with its rows as staged (a gate's row: numpy arrays,
    # a numpy scalar); the writer thread encodes them, and the record on disk must be
    # the one encode_rows would have built on the event loop.
    key = "g1_g2_a" + "ab" * 16 + "/0"
    row: dict[str, Any] = {  # a gate's own row: a numpy scalar is not a RowValue
        "input_ids": np.arange(7, dtype=np.int64),
        "token_mask": np.array([0, 0, 1, 1, 1, 1, 1], dtype=np.int8),
        "reward": np.float32(0.5),
        "turn": 0,
    }
    staged = StagedSeal(
        record=msgspec.structs.replace(_seal(), rows={}), rows={key: row}, keys=[key]
    )
    expected = msgspec.structs.replace(_seal(), rows=encode_rows({key: row}, [key]))
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    assert journal.seal(staged) == 0
    journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert [r.entry for r in records] == [expected]
    assert read_journal(tmp_path / SEAL_JOURNAL_DIRNAME).records[0].payload == encode_entry(
        expected
    )
    decoded = records[0].entry
    assert isinstance(decoded, SealRecord)
    assert np.array_equal(decode_row(decoded.rows[key], where="test")["input_ids"], np.arange(7))


def test_seal_many_journals_a_batch_in_order_and_counts_each_seal(tmp_path: Path) -> None:
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    seals = [msgspec.structs.replace(_seal(), generation_index=index) for index in range(3)]
    try:
        assert journal.step(1, []) == 0
        seqs = journal.seal_many(list(seals))
        assert seqs == range(1, 4)
        asyncio.run(journal.until_durable(seqs[-1]))
        metrics = journal.metrics()
        assert metrics["journal/seals_journaled"] == 3 and metrics["journal/seals_kept"] == 3
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert [r.entry for r in records[1:]] == seals


def _staged(index: int, length: int) -> StagedSeal:
    key = f"g1_g{index}_a" + "cd" * 16 + "/0"
    row: dict[str, Any] = {
        "input_ids": np.arange(length, dtype=np.int64),
        "token_mask": np.ones(length, dtype=np.int8),
        "reward": np.float32(0.5),
        "turn": 0,
    }
    record = msgspec.structs.replace(_seal(), generation_index=index, rows={})
    return StagedSeal(record=record, rows={key: row}, keys=[key])


def test_a_batch_s_records_do_not_count_towards_the_young_collection() -> None:
    # 128 seals alive together on the event loop until their batch is encoded: as
    # tracked objects they pushed the collector's young count over its threshold
    # about once more per train step. The records hold plain data only (no cycles).
    staged = [_staged(index, 4) for index in range(128)]
    gc.disable()
    try:
        gc.collect()  # (a full collection empties the tuples' free list: warm it after)
        seal_batch_record(staged)  # packing's per-row tuples come from the free list now
        before = gc.get_count()[0]
        records = [
            StagedSeal(record=seal.record, rows=seal.rows, keys=seal.keys) for seal in staged
        ]
        batch = seal_batch_record(records)
        after = gc.get_count()[0]
    finally:
        gc.enable()
    assert not any(map(gc.is_tracked, [*records, *batch.seals, batch, *batch.blocks]))
    # The batch's own lists (seals, counts, keys, positions, lengths, its columns' dict):
    # a handful of objects, not one or more per seal.
    assert after - before < 20


@_PLACEMENTS
def test_a_batch_of_staged_seals_is_one_record_that_replays_as_its_seals(
    tmp_path: Path, placement: JournalWriterPlacement
) -> None:
    staged = [_staged(index, length) for index, length in enumerate((3, 5, 0))]
    journal = _open_placed(tmp_path, placement)
    try:
        assert journal.step(1, []) == 0
        seqs = journal.seal_many(list(staged))
        assert seqs == range(1, 2)  # one record for the batch
        asyncio.run(journal.until_durable(seqs[-1]))
        metrics = journal.metrics()
        assert metrics["journal/seals_journaled"] == 3 and metrics["journal/seals_kept"] == 3
    finally:
        journal.close()
    replay = read_journal(tmp_path / SEAL_JOURNAL_DIRNAME)
    assert len(replay.records) == 2
    envelope = msgspec.msgpack.decode(replay.records[1].payload, type=JournalEnvelope)
    assert isinstance(envelope.entry, SealBatchRecord) and envelope.schema_version == 3
    records = decode_replay(replay)
    # Each seal as a record of its own would hold it, with the batch's seq and place.
    assert [r.entry for r in records[1:]] == [seal.journaled() for seal in staged]
    assert {(r.seq, r.offset) for r in records[1:]} == {(1, records[1].offset)}


def test_a_batch_record_is_read_only_at_its_own_version_and_only_whole(tmp_path: Path) -> None:
    batch = seal_batch_record([_staged(0, 2), _staged(1, 3)])
    old = msgspec.msgpack.encode(JournalEnvelope(schema_version=1, entry=batch))
    with pytest.raises(SealJournalRecordError, match="version 1 for a SealBatchRecord.*3"):
        decode_entry(old, where="here")
    short = msgspec.structs.replace(batch, row_counts=[2, 1])
    with pytest.raises(
        SealJournalRecordError, match="here: 2 seals, 2 row counts summing to 3, 2 staging keys"
    ):
        short.expanded(where="here")
    seals = [msgspec.structs.replace(batch.seals[0], rows=_seal().rows), batch.seals[1]]
    own_rows = msgspec.structs.replace(batch, seals=seals)
    with pytest.raises(SealJournalRecordError, match="seal 0 .* carries rows of its own"):
        own_rows.expanded(where="here")


def test_a_lone_record_msgpack_cannot_encode_stops_the_journal_on_the_loop(
    tmp_path: Path,
) -> None:
    # Encoded on the event loop: the caller's call returns None at once (nothing is queued,
    # and no later record may be written after the missing one), as a failed write does.
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        kept = journal.seal(_seal())
        unencodable = msgspec.structs.replace(_seal(), receipt={"reward": 1j})
        assert journal.seal(unencodable) is None
        assert isinstance(journal.failure, JournalEncodeError)
        assert "1 seal(s) from g1_g2_a" in str(journal.failure)
        assert journal.step(1, ["g1"]) is None
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert kept == 0 and [r.entry for r in records] == [_seal()]


def test_a_batch_with_a_row_the_journal_cannot_store_stops_the_journal_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    good = [_staged(0, 2), _staged(1, 3)]
    bad = [_staged(2, 2), _staged(3, 2)]
    key = bad[1].keys[0]
    bad[1] = StagedSeal(
        record=bad[1].record,
        rows={key: {**bad[1].rows[key], "input_ids": np.arange(2, dtype=np.complex64)}},
        keys=[key],
    )
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        assert journal.seal_many(list(good)) == range(0, 1)
        assert journal.seal_many(list(bad)) is None
        assert journal.failure is not None and "could not be encoded" in str(journal.failure)
        assert journal.seal_many(list(good)) is None  # nothing after the missing records
        assert journal.metrics()["journal/failed"] == 1.0
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert [r.entry for r in records] == [seal.journaled() for seal in good]


def _finalize(number: int) -> FinalizeRecord:
    return FinalizeRecord(
        group_id=f"g{number}", target_step=number, gate_rollout_ids=[f"a{number}", f"b{number}"]
    )


def _finalize_all(journal: SealJournal, records: list[FinalizeRecord]) -> None:
    for record in records:
        journal.finalized(
            record.group_id,
            target_step=record.target_step,
            gate_rollout_ids=record.gate_rollout_ids,
        )


def test_finalizations_are_held_and_go_as_one_record_before_the_next_one(
    tmp_path: Path,
) -> None:
    finalized = [_finalize(number) for number in range(5)]
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        _finalize_all(journal, finalized[:3])
        assert journal.next_seq == 0  # held: nothing handed to the writer yet
        assert journal.seal(_seal()) == 1  # after the three, as record 0
        _finalize_all(journal, finalized[3:])
        assert journal.step(2, ["g3", "g4"]) == 3
        assert journal.metrics()["journal/finalizations"] == 5
    finally:
        journal.close()
    replay = read_journal(tmp_path / SEAL_JOURNAL_DIRNAME)
    assert len(replay.records) == 4
    envelope = msgspec.msgpack.decode(replay.records[0].payload, type=JournalEnvelope)
    assert isinstance(envelope.entry, FinalizeBatchRecord) and envelope.schema_version == 4
    records = decode_replay(replay)
    # Replay sees each finalization as a record of its own, in the order they were applied.
    assert [r.entry for r in records] == [
        *finalized[:3],
        _seal(),
        *finalized[3:],
        StepRecord(trainer_version=2, group_ids=["g3", "g4"]),
    ]
    assert [r.seq for r in records] == [0, 0, 0, 1, 2, 2, 3]


def test_held_finalizations_are_written_at_the_close(tmp_path: Path) -> None:
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    _finalize_all(journal, [_finalize(0)])
    asyncio.run(journal.aclose())
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert [r.entry for r in records] == [_finalize(0)]


def test_a_full_hold_is_appended_without_waiting_for_another_record(tmp_path: Path) -> None:
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        _finalize_all(journal, [_finalize(n) for n in range(MAX_HELD_FINALIZATIONS - 1)])
        assert journal.next_seq == 0
        _finalize_all(journal, [_finalize(MAX_HELD_FINALIZATIONS - 1)])
        assert journal.next_seq == 1
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert len(records) == MAX_HELD_FINALIZATIONS and {r.seq for r in records} == {0}


def test_a_finalize_batch_is_read_only_at_its_own_version_and_never_empty() -> None:
    batch = FinalizeBatchRecord(finalizations=[_finalize(0), _finalize(1)])
    assert decode_entry(encode_entry(batch), where="here") == batch
    old = msgspec.msgpack.encode(JournalEnvelope(schema_version=1, entry=batch))
    with pytest.raises(SealJournalRecordError, match="version 1 for a FinalizeBatchRecord.*4"):
        decode_entry(old, where="here")
    with pytest.raises(SealJournalRecordError, match="here: a finalizes record holds no"):
        FinalizeBatchRecord(finalizations=[]).expanded(where="here")


def test_held_finalizations_that_cannot_be_encoded_stop_the_journal(tmp_path: Path) -> None:
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        journal.finalized("g\ud800", target_step=None, gate_rollout_ids=["a"])  # no UTF-8
        assert journal.step(1, []) is None  # nothing after the missing record
        assert isinstance(journal.failure, JournalEncodeError)
        assert "1 finalization(s) from g" in str(journal.failure)
        journal.finalized("g2", target_step=None, gate_rollout_ids=["a"])
        assert journal.metrics()["journal/finalizations"] == 1  # refused once stopped
    finally:
        journal.close()
    assert read_journal(tmp_path / SEAL_JOURNAL_DIRNAME).records == []


def test_a_snapshot_s_seq_is_taken_after_the_finalizations_it_reflects(tmp_path: Path) -> None:
    # A snapshot reflects every finalization applied before its cut: their records must
    # stand below its seq, or a restore from it counts them as after it.
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        _finalize_all(journal, [_finalize(0), _finalize(1)])
        assert journal.snapshot_seq() == 1  # the held two, as record 0, below it
        assert journal.snapshot_seq() == 1  # nothing held: nothing appended
    finally:
        journal.close()
    records = decode_replay(read_journal(tmp_path / SEAL_JOURNAL_DIRNAME))
    assert [(r.seq, r.entry) for r in records] == [(0, _finalize(0)), (0, _finalize(1))]


def test_bytes_appended_counts_every_payload_and_covering_moves_the_base(tmp_path: Path) -> None:
    # What the periodic snapshots' journal trigger reads: the payload bytes a replay from
    # the newest committed snapshot would read, held finalizations included.
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        journal.seal(_seal())
        _finalize_all(journal, [_finalize(0)])
        captured_at = journal.snapshot_seq()  # appends the held finalization first
        at_capture = journal.bytes_appended
        journal.step(1, ["g1"])
        assert journal.covered_bytes == 0
        journal.covering(captured_at)
        assert journal.covered_bytes == at_capture
        journal.covering(captured_at + 5)  # a seq no capture took leaves the base as it was
        assert journal.covered_bytes == at_capture
    finally:
        journal.close()
    payloads = [
        record.payload
        for segment in read_journal(tmp_path / SEAL_JOURNAL_DIRNAME).segments
        for record in segment.records
    ]
    assert len(payloads) == 3
    assert at_capture == len(payloads[0]) + len(payloads[1])
    assert journal.bytes_appended == sum(map(len, payloads))
    # A restart counts what its journal holds: no snapshot of the new start covers it yet.
    reopened = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    try:
        assert reopened.bytes_appended == sum(map(len, payloads))
        assert reopened.covered_bytes == 0
    finally:
        reopened.close()


def test_the_growth_alarm_rings_from_its_threshold_on_and_when_the_journal_stops(
    tmp_path: Path,
) -> None:
    journal = SealJournal.open(tmp_path, SealJournalConfig(commit_interval_ms=0.0))
    rings: list[int] = []
    try:
        journal.step(1, ["g1"])
        threshold = 2 * journal.bytes_appended + 1
        journal.set_growth_alarm(threshold, lambda: rings.append(journal.bytes_appended))
        journal.step(2, ["g1"])
        assert rings == [] and journal.bytes_appended < threshold
        journal.step(3, ["g1"])
        journal.step(4, ["g1"])
        assert len(rings) == 2 and rings[0] >= threshold
        journal.clear_growth_alarm()
        journal.step(5, ["g1"])
        assert len(rings) == 2
        journal.set_growth_alarm(10 * threshold, lambda: rings.append(-1))
        assert journal.seal(msgspec.structs.replace(_seal(), receipt={"x": 1j})) is None
        assert rings[-1] == -1  # stopped: seals are kept by snapshots alone from now on
    finally:
        journal.close()
