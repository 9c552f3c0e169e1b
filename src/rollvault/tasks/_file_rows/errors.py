"""The error of a bad dataset file, and the place in the file it names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollvault.config.errors import ConfigError

__all__ = ["DatasetFileError", "RowPlace"]


class DatasetFileError(ConfigError):
    """A dataset file cannot be used; the message names the file, the row and the field.

    A :class:`~rollvault.config.errors.ConfigError`: ``rollvault run`` shows the
    message and exits 2. Raised while the dataset is built, before anything is
    written to the checkpoint directory.
    """

    def __init__(
        self, path: Path, problem: str, *, place: str | None = None, field: str | None = None
    ) -> None:
        self.path = path
        self.place = place
        """``"line 4"`` (JSONL, 1-based) or ``"row 4"`` (Parquet, 1-based); None: the whole file."""
        self.field = field
        """The field of the row, ``"prompt"`` or ``"messages[1].role"``; None: the whole row."""
        where = f"dataset file {path}" + (f", {place}" if place else "")
        where += f", field {field!r}" if field else ""
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class RowPlace:
    """Where a row is in its file: ``unit`` ``"line"`` or ``"row"``, and its 1-based number."""

    path: Path
    unit: str
    number: int

    def __str__(self) -> str:
        return f"{self.path} {self.unit} {self.number}"

    def error(self, problem: str, *, field: str | None = None) -> DatasetFileError:
        """The error of a problem of this row (of its ``field``, when given)."""
        return DatasetFileError(self.path, problem, place=f"{self.unit} {self.number}", field=field)
