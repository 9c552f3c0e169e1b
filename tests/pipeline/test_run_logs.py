from pathlib import Path

import msgspec
import pytest

from rollvault.controller.loop.run_logs import (
    TAIL_CHUNK,
    AttemptLogRecord,
    JsonlWriter,
    LogSequence,
    TrainLogRecord,
    complete_lines_end,
    read_jsonl,
)
from rollvault.ledger.statuses import RolloutAttemptStatus


def _record(step: int) -> TrainLogRecord:
    return TrainLogRecord(
        step=step,
        trainer_version=step,
        group_id=f"g{step}",
        sample_id=str(step),
        epoch=0,
        rewards=[0.5, 1.0],
        gate_rollout_ids=[f"g{step}_g0_a00", f"g{step}_g1_a00"],
        target_step=step,
        incarnation=1,
    )


def _stamped(step: int, seq: int) -> TrainLogRecord:
    return msgspec.structs.replace(_record(step), seq=seq)


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(path, LogSequence())
    for step in range(3):
        writer.write(_record(step))
    writer.close()
    assert read_jsonl(path, TrainLogRecord) == [_stamped(0, 1), _stamped(1, 2), _stamped(2, 3)]


def test_many_records_go_in_order_in_one_write(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(path, LogSequence())
    writer.write(_record(0))
    writer.write_many([_record(1), _record(2)])
    writer.write_many([])  # nothing to write, no seq taken
    writer.write(_record(3))
    writer.close()
    assert read_jsonl(path, TrainLogRecord) == [_stamped(step, step + 1) for step in range(4)]


def test_records_built_with_taken_seqs_are_written_as_given(tmp_path: Path) -> None:
    """``take_seqs`` takes numbers from the run-wide sequence as ``write`` would, and
    ``write_stamped`` writes records that carry them, in order, unchanged."""
    path = tmp_path / "train_log.jsonl"
    sequence = LogSequence(4)
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(path, sequence)
    writer.write(_record(0))
    seqs = writer.take_seqs(3)
    assert list(seqs) == [6, 7, 8]
    assert sequence.value == 8
    writer.write_stamped([_stamped(step, seq) for step, seq in zip((1, 2, 3), seqs, strict=True)])
    writer.write_stamped([])  # nothing to write
    assert writer.take_seqs(0) == range(9, 9)
    writer.write(_record(4))
    writer.close()
    assert read_jsonl(path, TrainLogRecord) == [
        _stamped(0, 5),
        _stamped(1, 6),
        _stamped(2, 7),
        _stamped(3, 8),
        _stamped(4, 9),
    ]


def test_reader_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(path, LogSequence())
    writer.write(_record(0))
    writer.close()
    with open(path, "ab") as f:
        f.write(b'{"step": 1, "trainer_ver')
    assert read_jsonl(path, TrainLogRecord) == [_stamped(0, 1)]


def test_next_writer_cuts_the_torn_line_off(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    path.write_bytes(b"")
    writer: JsonlWriter[TrainLogRecord] = JsonlWriter(path, LogSequence())
    writer.write(_record(0))
    writer.close()
    with open(path, "ab") as f:
        f.write(b'{"step": 1, "trai')
    writer = JsonlWriter(path, LogSequence())
    writer.write(_record(1))
    writer.close()
    assert read_jsonl(path, TrainLogRecord) == [_stamped(0, 1), _stamped(1, 1)]
    assert path.read_bytes().count(b"\n") == 2


def test_damage_in_the_middle_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    good = AttemptLogRecord(
        gate_rollout_id="g_g0_a1",
        group_id="g",
        generation_index=0,
        status=RolloutAttemptStatus.SEALED,
        num_tokens=4,
        incarnation=1,
    )
    writer: JsonlWriter[AttemptLogRecord] = JsonlWriter(path, LogSequence())
    writer.write(good)
    writer.close()
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    writer = JsonlWriter(path, LogSequence())
    writer.write(good)
    writer.close()
    with pytest.raises(ValueError, match=r"attempts.jsonl:2: damaged log line"):
        read_jsonl(path, AttemptLogRecord)


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "nope.jsonl", TrainLogRecord) == []


def test_writers_sharing_a_sequence_number_lines_run_wide(tmp_path: Path) -> None:
    sequence = LogSequence(10)
    train: JsonlWriter[TrainLogRecord] = JsonlWriter(tmp_path / "t.jsonl", sequence)
    drops: JsonlWriter[TrainLogRecord] = JsonlWriter(tmp_path / "d.jsonl", sequence)
    train.write(_record(0))
    drops.write(_record(1))
    train.write(_record(2))
    train.close()
    drops.close()
    assert [r.seq for r in read_jsonl(tmp_path / "t.jsonl", TrainLogRecord)] == [11, 13]
    assert [r.seq for r in read_jsonl(tmp_path / "d.jsonl", TrainLogRecord)] == [12]
    assert sequence.value == 13


@pytest.mark.parametrize("torn", [0, 1, TAIL_CHUNK - 1, TAIL_CHUNK, 3 * TAIL_CHUNK + 5])
def test_a_torn_tail_of_any_length_is_cut_at_the_last_complete_line(
    tmp_path: Path, torn: int
) -> None:
    """The tail is read a chunk at a time from the end: a torn line longer than a chunk,
    or one that ends exactly at a chunk's edge, is still cut at the newline before it."""
    path = tmp_path / "attempts.jsonl"
    complete = b"".join(b'{"n": %d}\n' % number for number in range(TAIL_CHUNK // 4))
    path.write_bytes(complete + b"x" * torn)
    assert complete_lines_end(path) == len(complete)
    JsonlWriter(path, LogSequence()).close()
    assert path.read_bytes() == complete


@pytest.mark.parametrize("size", [0, 5, 2 * TAIL_CHUNK + 1])
def test_a_log_without_a_newline_is_cut_to_nothing(tmp_path: Path, size: int) -> None:
    path = tmp_path / "attempts.jsonl"
    path.write_bytes(b"x" * size)
    assert complete_lines_end(path) == 0
    JsonlWriter(path, LogSequence()).close()
    assert path.read_bytes() == b""
