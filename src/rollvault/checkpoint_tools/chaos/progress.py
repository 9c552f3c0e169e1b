"""A start's training progress, read from its own ``train_log.jsonl`` while it runs.

The progress-based kill schedule waits for a start to log a number of train
steps of its own. The run writes one ``train_log.jsonl`` line per trained
group, stamped with the step and the start (incarnation) that trained it; a
step counts once its first line is there (the optimizer step is applied
before its lines are written). The watch only reads the file, and reads each
complete line once: it keeps the offset after the last newline it consumed.
A last line without its newline (being written, or torn by an earlier kill)
is left for a later read; the next start's writer only ever cuts off such a
tail, never a consumed line, so the offset stays valid.
"""

from __future__ import annotations

from pathlib import Path

import msgspec


class _StepLine(msgspec.Struct):
    """The two fields of a train-log line the watch needs (others are ignored)."""

    step: int
    incarnation: int


class TrainStepWatch:
    """Counts the distinct train steps one start logged in ``train_log.jsonl``."""

    def __init__(self, path: Path, incarnation: int) -> None:
        self._path = path
        self._incarnation = incarnation
        self._offset = 0
        self._steps: set[int] = set()
        self._decoder = msgspec.json.Decoder(_StepLine)

    def steps(self) -> int:
        """The start's train steps so far; raises ``ValueError`` on a damaged complete line."""
        try:
            with open(self._path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return 0  # no step logged yet by any start
        complete = data.rfind(b"\n") + 1
        for line in data[:complete].splitlines():
            self._count(line)
        self._offset += complete
        return len(self._steps)

    def _count(self, line: bytes) -> None:
        try:
            record = self._decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise ValueError(
                f"{self._path}: damaged line after byte {self._offset}: {exc}"
            ) from exc
        if record.incarnation == self._incarnation:
            self._steps.add(record.step)
