"""Append-only JSONL run logs: what was trained, and what every attempt became.

``train_log.jsonl`` has one line per trained group, ``attempts.jsonl`` one
line per attempt that reached a terminal status, ``drops.jsonl`` one line per
prompt group given up, ``restores.jsonl`` one line per restore,
``shutdowns.jsonl`` one line per start stopped by a signal, ``pending.jsonl``
one line per prompt a start left untrained when it ended (not by a signal). They are the
evidence the chaos harness checks exactly-once against, so each line is
handed to the operating system as it is written. A SIGKILL can still tear the
last line; readers drop a torn final line (and only a final one: a torn line
in the middle means the file is damaged and is an error).

A line that cannot be written (the disk stays full, an I/O error) is never
dropped: it is cut off whole, the writer refuses every later line, and the
:class:`~rollvault.controller.loop.io_failures.LogWriteError` stops the run
(see :mod:`rollvault.controller.loop.append_only_file`).

Every line carries ``seq``, a run-wide counter that rollout snapshots capture.
A restore from a snapshot taken at ``seq = S`` rolls back whatever earlier
incarnations logged after ``S``; its ``restores.jsonl`` line says so, which is
how a reader computes the run's effective history.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Generic, TypeVar

import msgspec

from rollvault.controller.loop.append_only_file import AppendOnlyFile
from rollvault.controller.loop.io_failures import LogWriteError
from rollvault.ledger.statuses import RolloutAttemptStatus

TRAIN_LOG_FILENAME = "train_log.jsonl"
ATTEMPTS_LOG_FILENAME = "attempts.jsonl"
DROPS_LOG_FILENAME = "drops.jsonl"
RESTORES_LOG_FILENAME = "restores.jsonl"
INCARNATION_FILENAME: Final = "incarnation"
"""The start counter every start writes first: it also marks a log directory as rollvault's."""
SHUTDOWNS_LOG_FILENAME = "shutdowns.jsonl"
PENDING_LOG_FILENAME = "pending.jsonl"
TURNS_LOG_FILENAME = "turns.jsonl"


class TrainLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One trained prompt group."""

    step: int
    trainer_version: int
    group_id: str
    sample_id: str
    epoch: int
    rewards: list[float]
    gate_rollout_ids: list[str]
    target_step: int | None
    incarnation: int
    seq: int = 0


class AttemptLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One attempt that reached sealed, failed or abandoned."""

    gate_rollout_id: str
    group_id: str
    generation_index: int
    status: RolloutAttemptStatus
    num_tokens: int
    incarnation: int
    reason: str | None = None
    reward: float | None = None
    """The gate's reward of a sealed attempt, before penalties (None: not sealed, or a
    line of an older version)."""
    checks: dict[str, bool | float] | None = None
    """The reward's named checks of a sealed attempt (``correct``, ``format_ok``, and a
    reward function's own keys); None as for ``reward``."""
    staging_keys: list[str] | None = None
    """A sealed attempt's turns in order (its receipt's keys; each names the attempt
    that generated it, an earlier one for a continued episode); None as for ``reward``."""
    adopted_from: str | None = None
    """A sealed attempt whose tokens a restore took from the seal journal: the gate
    rollout id of the attempt (of a group the restore lost) that generated them."""
    seq: int = 0


class TurnLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One committed turn of a (multi-turn) attempt: the evidence turn-level restore is checked on."""

    gate_rollout_id: str
    group_id: str
    generation_index: int
    turn_index: int
    staging_key: str
    num_tokens: int
    """Tokens the model generated in this turn."""
    incarnation: int
    seq: int = 0


class DropLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One prompt group given up for good (retry budget exhausted)."""

    group_id: str
    sample_id: str
    epoch: int
    target_step: int | None
    replaced: bool
    """Whether a spare prompt took its place (``replace``) or its step shrank."""
    incarnation: int
    seq: int = 0


class RestoreLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One start that resumed a run, and what it kept."""

    incarnation: int
    restore_mode: str
    snapshot: str | None
    """The snapshot directory restored from (None: nothing to restore)."""
    restored_seq: int
    """Log lines of earlier incarnations with a larger ``seq`` were rolled back."""
    base_train_step: int
    canonical_group_ids: list[str]
    """Groups restored already finalized: they must train as they are, not regenerated."""
    siblings_reused: int
    attempts_redispatched: int
    groups_regenerated: int
    rows_dropped: int
    seconds: float
    attempts_interrupted: int = 0
    """Attempts in flight when the previous start died (0 in logs of older versions)."""
    skipped: list[str] = msgspec.field(default_factory=list)
    """Newer trainer checkpoints this start could not use, each ``path: why``."""
    turns_resumed: int = 0
    """Committed turns of interrupted episodes that restore continues from."""
    episodes_resumed: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """Per sibling (logical rollout id) whose episode continues at its last committed
    turn, the staging keys of the committed turns it continues from."""
    episodes_restarted: list[str] = msgspec.field(default_factory=list)
    """Episodes restarted from their first turn, each ``logical id: why``."""
    journal_records: int = 0
    """Seal journal records after the snapshot that the restore read."""
    journal_seals_replayed: int = 0
    """Seals after the snapshot re-applied from the seal journal (not generated again)."""
    journal_seals_unmatched: int = 0
    """Journaled seals of groups or attempts the snapshot does not hold: generated again."""
    journal_damage: str | None = None
    """The torn or corrupt journal record the restore cut off (None: none)."""
    prefix_tokens_resumed: int = 0
    """Tokens of journaled partial turns that fresh attempts continue after
    (``rollout.prefix_resume``): kept, not generated again."""
    prefixes_resumed: dict[str, int] = msgspec.field(default_factory=dict)
    """Per logical rollout id, the tokens of the partial turn its fresh attempt continues."""
    journal_partials_pooled: int = 0
    """Partials of groups reserved after the snapshot, for their prompts' next groups."""
    seq: int = 0


class ShutdownLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One start stopped early by SIGTERM or SIGINT, and where a restart resumes."""

    incarnation: int
    signal: str
    """The signal's name, e.g. ``SIGTERM``."""
    checkpoint_dir: str
    final_snapshot: str | None
    """The snapshot written after the signal (None: nothing had changed since the last
    one, rollout checkpointing is off, or the grace ran out)."""
    resume_from: str | None
    """The newest committed rollout snapshot of this start's anchor when it stopped: the
    one a restart restores (None: none exists yet; a restart begins from scratch). Past
    the grace, a snapshot still being written may yet commit and be newer."""
    grace_exceeded: bool
    """The final snapshot did not finish within ``shutdown_grace_s``."""
    attempts_in_flight: int
    """Attempts dispatched and unfinished when the pumps stopped: a restart redoes them."""
    trainer_version: int
    """Steps trained when the run stopped."""
    base_train_step: int
    """The last trainer checkpoint's step: a restart resumes there and trains the
    groups trained since again, from the snapshot."""
    seconds: float
    """From the signal until the run stopped."""
    seq: int = 0


class PendingReason(enum.StrEnum):
    """Where a prompt left untrained at the end of a run was."""

    SPARE = "spare"
    """Held in the replacement reserve."""
    IN_FLIGHT = "in_flight"
    """Reserved in the ledger, not finalized (waiting for or in generation)."""
    BUFFERED = "buffered"
    """Finalized and waiting in the replay index."""
    NOT_DRAWN = "not_drawn"
    """Not drawn yet from the dataloader's current epoch."""


class PendingLogRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One prompt of a reached epoch that a start left untrained when it ended (its
    ``grpo.max_num_steps`` ran out): it was stopped early, not lost. A later start that restores and trains
    it rolls this line back (it is written after the start's final snapshot)."""

    epoch: int
    sample_id: str
    reason: PendingReason
    group_id: str | None
    """The prompt group (None: a spare or a prompt not drawn, which have none)."""
    trainer_version: int
    """Steps trained when the start ended."""
    incarnation: int
    seq: int = 0


RecordT = TypeVar(
    "RecordT",
    TrainLogRecord,
    AttemptLogRecord,
    DropLogRecord,
    RestoreLogRecord,
    ShutdownLogRecord,
    PendingLogRecord,
    TurnLogRecord,
)


class LogSequence:
    """The run-wide line counter shared by every log of one run."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def next(self) -> int:
        self.value += 1
        return self.value

    def take(self, count: int) -> range:
        """The next ``count`` numbers, taken at once (as ``count`` calls of :meth:`next`)."""
        first = self.value + 1
        self.value += count
        return range(first, first + count)


TAIL_CHUNK: Final = 64 * 1024
"""Bytes read per step, from the end, when looking for a log's last complete line."""


def complete_lines_end(path: Path) -> int:
    """The size ``path`` has up to and including its last newline (0: none).

    Read from the end, a chunk at a time, until a newline: every run start
    opens its logs, and the attempts log grows by a line per attempt over the
    whole run (thousands per restore), so reading all of it to find a torn
    last line made each start slower than the last.
    """
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        while end > 0:
            start = max(0, end - TAIL_CHUNK)
            file.seek(start)
            newline = file.read(end - start).rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            end = start
    return 0


class JsonlWriter(Generic[RecordT]):
    """Appends records, one JSON line each, written per line, stamped with ``seq``."""

    def __init__(self, path: Path, sequence: LogSequence) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._sequence = sequence
        self._file = AppendOnlyFile(path)
        self._encoder = msgspec.json.Encoder()
        self._repair_torn_tail()

    @property
    def failure(self) -> LogWriteError | None:
        """Why this log refuses lines (None: it takes them)."""
        return self._file.failure

    def _repair_torn_tail(self) -> None:
        # A previous incarnation may have died mid-line. Cut its torn line off
        # so that the file holds complete lines only, and a damaged line in the
        # middle of a log always means real damage.
        complete = complete_lines_end(self._path)
        if complete != self._path.stat().st_size:
            self._file.truncate(complete)

    def write(self, record: RecordT) -> None:
        """Append ``record``; raises :class:`LogWriteError` if it cannot be written."""
        stamped = msgspec.structs.replace(record, seq=self._sequence.next())
        self._file.append(self._encoder.encode(stamped) + b"\n")

    def write_many(self, records: list[RecordT]) -> None:
        """Append ``records`` in order with one write (a restore logs thousands at once).

        Raises :class:`LogWriteError` if they cannot be written; then none of
        them is in the file (a failed write's partial lines are cut off).
        """
        if not records:
            return
        replace = msgspec.structs.replace
        seqs = self._sequence.take(len(records))
        self.write_stamped(
            [replace(record, seq=seq) for record, seq in zip(records, seqs, strict=True)]
        )

    def take_seqs(self, count: int) -> range:
        """The ``seq`` of the next ``count`` lines, for records built with it already set.

        A caller that logs thousands of lines at once (a restore's interruptions)
        builds each in its final form and hands them to :meth:`write_stamped`,
        instead of a copy of each made by :meth:`write_many` to stamp it.
        """
        return self._sequence.take(count)

    def write_stamped(self, records: list[RecordT]) -> None:
        """Append ``records``, each already carrying the ``seq`` :meth:`take_seqs` gave,
        in order with one write; as :meth:`write_many` on failure."""
        if records:
            self._file.append(self._encoder.encode_lines(records))

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path, record_type: type[RecordT]) -> list[RecordT]:
    """Read every complete record; tolerate a torn line only at the very end."""
    return list(_iter_records(path, record_type))


def _iter_records(path: Path, record_type: type[RecordT]) -> Iterator[RecordT]:
    if not path.exists():
        return
    decoder = msgspec.json.Decoder(record_type)
    lines = path.read_bytes().split(b"\n")
    last = len(lines) - 1
    for number, line in enumerate(lines):
        if number == last:
            return  # empty after the final newline, or a torn last line
        try:
            yield decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number + 1}: damaged log line: {exc}") from exc
