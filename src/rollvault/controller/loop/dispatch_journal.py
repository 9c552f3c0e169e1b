"""The dispatch journal: which attempts went to the gate, and which came back.

Snapshots are taken seconds or a minute apart. An attempt that kills the
controller process can be dispatched, and kill it, between two snapshots, so
the ledger a restore loads may not show it dispatched, or may not even hold
its group; and the restarted run would dispatch it again, first. The journal
is the write-ahead record of dispatch: the rollout pump appends a line naming
a round's attempts before it hands them to the gate, and a line for each
attempt that comes back (sealed, failed, or cancelled by the controller). On
restore, an attempt that was dispatched and never came back was in flight
when the process died (:mod:`rollvault.controller.snapshots.crash_evidence`).

Each line is handed to the operating system, not fsynced: it survives the
death of the process, which is what a poison prompt causes, at the cost of a
write call per line. A power loss may lose the last lines; the attempts they
name are then not charged for that crash. A line that cannot be written (the
disk stays full, an I/O error) stops the run with a
:class:`~rollvault.controller.loop.io_failures.LogWriteError` before its
attempts reach the gate: dispatching them unrecorded would let a poison
prompt go uncharged (see :mod:`rollvault.controller.loop.append_only_file`).

Every line carries ``seq``, a counter over the whole journal that is never
reset: each start continues after the highest ``seq`` on disk. A snapshot
records the ``seq`` it reflects (its controller state's
``dispatch_journal_seq``): lines are written inside mutation sections of the
cut, with the ledger change they describe, so the effect of every line up
to that ``seq`` is in the snapshot.

On disk: ``<checkpoint_dir>/dispatch_journal/segment_<first seq>.jsonl``. A
start writes a new segment (never appending to one a dead process may have
torn), and so does the first write after each committed snapshot; a segment
goes once a committed snapshot reflects every line in it (a restore that
falls back to an older snapshot may then miss some: the attempts they name
are not charged for that death). Readers drop a
torn final line of a segment. A damaged line elsewhere is logged and ends
the reading of its segment: the journal only ever adds evidence against a
prompt, so a restore goes on without what it cannot read.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import msgspec

from rollvault.controller.loop.append_only_file import AppendOnlyFile
from rollvault.controller.loop.io_failures import LogWriteError
from rollvault.ledger.records import InterruptedAttempt

DISPATCH_JOURNAL_DIRNAME: Final = "dispatch_journal"
_LOG = logging.getLogger("rollvault.restore")
_SEGMENT_RE: Final = re.compile(r"segment_(\d{12})\.jsonl")

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_AttemptHex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]


class JournalAttempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One attempt of a dispatched round."""

    generation_index: _NonNegativeInt
    attempt_uuid: _AttemptHex


class DispatchedLine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="dispatched"
):
    """A round of a group's attempts, about to be handed to the gate."""

    seq: _NonNegativeInt
    group_id: str
    epoch: _NonNegativeInt
    dataset_idx: _NonNegativeInt
    attempts: list[JournalAttempt]


class ReturnedLine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag="returned"
):
    """An attempt the gate returned from (or the controller cancelled): it killed nothing."""

    seq: _NonNegativeInt
    attempt_uuid: _AttemptHex


JournalLine = DispatchedLine | ReturnedLine


class LostGroupInterruption(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """An attempt that was in flight at a death, of a group the restore could not keep.

    The group was reserved after the snapshot the restore used, so it is
    lost with the process; its prompt will be reserved again, and the new
    group inherits this attempt as an interrupted failure. Kept in snapshots
    (controller state) until then.
    """

    group_id: str
    """The lost group."""
    epoch: _NonNegativeInt
    dataset_idx: _NonNegativeInt
    generation_index: _NonNegativeInt
    attempt_uuid: _AttemptHex
    reason: str

    def interrupted_attempt(self) -> InterruptedAttempt:
        """The ledger's record of it, for the prompt's next group."""
        return InterruptedAttempt(
            generation_index=self.generation_index,
            attempt_uuid=uuid.UUID(hex=self.attempt_uuid),
            reason=self.reason,
        )


def segment_path(directory: Path, first_seq: int) -> Path:
    return directory / f"segment_{first_seq:012d}.jsonl"


def journal_segments(directory: Path) -> list[tuple[int, Path]]:
    """Every segment in ``directory`` with its first ``seq``, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _SEGMENT_RE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


_DECODER: Final = msgspec.json.Decoder(JournalLine)


def read_segment(path: Path) -> list[JournalLine]:
    """Every complete line of one segment, up to a torn or damaged one."""
    lines = path.read_bytes().split(b"\n")
    records = []
    last = len(lines) - 1
    for number, line in enumerate(lines):
        try:
            records.append(_DECODER.decode(line))
        except msgspec.DecodeError as exc:
            if number != last:  # the last is empty after the final newline, or torn by a kill
                _LOG.warning(
                    "%s:%d: damaged dispatch journal line, the rest of the segment is ignored: %s",
                    path,
                    number + 1,
                    exc,
                )
            break
    return records


@dataclass(frozen=True)
class JournalTail:
    """What a restore needs from the journal."""

    dispatched: list[DispatchedLine]
    """Rounds dispatched after the restored snapshot, in order."""
    returned: frozenset[str]
    """Hex UUIDs of every attempt that came back, in every segment still on disk."""


def read_dispatch_journal(directory: Path, *, after_seq: int) -> JournalTail:
    """Read the journal in ``directory`` for a snapshot that reflects it up to ``after_seq``."""
    dispatched: list[DispatchedLine] = []
    returned: set[str] = set()
    for _, path in journal_segments(directory):
        for line in read_segment(path):
            if isinstance(line, ReturnedLine):
                returned.add(line.attempt_uuid)
            elif line.seq > after_seq:
                dispatched.append(line)
    dispatched.sort(key=lambda line: line.seq)
    return JournalTail(dispatched=dispatched, returned=frozenset(returned))


class DispatchJournal:
    """Appends journal lines, one flushed JSON line each, in segments under ``directory``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._seq = _last_seq(directory)
        self._file: AppendOnlyFile | None = None
        self._encoder = msgspec.json.Encoder()
        self.failure: LogWriteError | None = None
        """Why the journal refuses lines (None: it takes them)."""

    @property
    def seq(self) -> int:
        """The ``seq`` of the last line written (the journal's position)."""
        return self._seq

    def dispatched(
        self, *, group_id: str, epoch: int, dataset_idx: int, attempts: list[tuple[int, str]]
    ) -> None:
        """Record a round about to be dispatched: ``(generation index, attempt hex)`` pairs."""
        self._write(
            DispatchedLine(
                seq=self._seq + 1,
                group_id=group_id,
                epoch=epoch,
                dataset_idx=dataset_idx,
                attempts=[
                    JournalAttempt(generation_index=index, attempt_uuid=attempt)
                    for index, attempt in attempts
                ],
            )
        )

    def returned(self, attempt_uuid: str) -> None:
        """Record that an attempt came back (or was cancelled): it did not kill the process."""
        self._write(ReturnedLine(seq=self._seq + 1, attempt_uuid=attempt_uuid))

    def returned_many(self, attempt_uuids: Sequence[str]) -> None:
        """Record several returned attempts (a seal batch's) in one write, in order.

        Each line is its own evidence: a kill during the write leaves the whole
        lines before it, and a reader drops the torn one (its attempt is then
        charged, as if the kill had come before :meth:`returned`).
        """
        first = self._seq + 1
        self._write_lines(
            [
                ReturnedLine(seq=first + offset, attempt_uuid=attempt)
                for offset, attempt in enumerate(attempt_uuids)
            ]
        )

    def prune(self, reflected_seq: int) -> None:
        """A snapshot reflecting lines up to ``reflected_seq`` is committed: drop what it covers.

        The next line starts a new segment; every segment whose lines are all
        covered is deleted.
        """
        self._close_segment()
        segments = journal_segments(self._directory)
        for position, (_, path) in enumerate(segments):
            is_last = position + 1 == len(segments)
            last_seq = self._seq if is_last else segments[position + 1][0] - 1
            if last_seq <= reflected_seq:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self._close_segment()

    def _write(self, line: JournalLine) -> None:
        self._write_lines([line])

    def _write_lines(self, lines: Sequence[JournalLine]) -> None:
        """Append ``lines`` (consecutive ``seq`` after :attr:`seq`) in one write call."""
        if not lines:
            return
        if self.failure is not None:
            raise self.failure
        try:
            if self._file is None:
                # A new segment, named for its first line: never one a dead process wrote.
                path = segment_path(self._directory, lines[0].seq)
                try:
                    self._file = AppendOnlyFile(path, exclusive=True)
                except OSError as exc:
                    raise LogWriteError(f"cannot create {path}: {exc.strerror or exc}") from exc
            self._file.append(self._encoder.encode_lines(lines))
        except LogWriteError as error:
            self.failure = error
            raise
        self._seq = lines[-1].seq

    def _close_segment(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _last_seq(directory: Path) -> int:
    """The highest ``seq`` on disk (0 for none), from the newest segment with a complete line.

    A newer segment without one holds at most a line torn before its write
    returned, so before its attempts went to the gate: it is removed, and
    its name is free for the next segment.
    """
    for _, path in reversed(journal_segments(directory)):
        lines = read_segment(path)
        if lines:
            return lines[-1].seq
        path.unlink()
    return 0
