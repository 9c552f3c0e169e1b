"""A file's rows as a stable map-style prompt dataset.

Row ``i`` of the dataset is the file's ``i``-th row (JSONL: its ``i``-th
non-blank line; Parquet: its ``i``-th row): the same index gives the same
prompt in every process that reads the same file. Every row is one prompt of
an epoch; ``dataset.num_prompts`` is not used (an epoch is the whole file).

Each datum is kept as its canonical JSON (sorted keys), so ``__getitem__``
hands out a fresh copy (a caller may change it without changing the dataset)
and ``identity`` is the SHA-256 of bytes already made: the same digest as
:func:`~rollvault.tasks.protocols.prompt_identity` of the datum, at no cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import msgspec

from rollvault.config.errors import ConfigError
from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks._file_rows.datum import row_datum
from rollvault.tasks._file_rows.errors import DatasetFileError, RowPlace

__all__ = ["FileRowDataset", "build_file_dataset", "file_path"]


class FileRowDataset:
    """The rows of one dataset file, by index (see the module docstring)."""

    def __init__(self, path: Path, *, unit: str, numbers: list[int], encoded: list[bytes]) -> None:
        if len(numbers) != len(encoded):
            raise ValueError(f"FileRowDataset: {len(numbers)} row numbers for {len(encoded)} rows")
        self.path = path
        self._unit = unit
        self._numbers = numbers
        self._encoded = encoded

    def __len__(self) -> int:
        return len(self._encoded)

    def __getitem__(self, idx: int) -> DatumSpec:
        return cast(DatumSpec, msgspec.json.decode(self._encoded[self._checked(idx)]))

    def identity(self, idx: int) -> str:
        """SHA-256 of the datum at ``idx`` (equal to ``prompt_identity(self[idx])``)."""
        return hashlib.sha256(self._encoded[self._checked(idx)]).hexdigest()

    def describe(self, idx: int) -> str:
        """Where row ``idx`` is in the file: ``"data.jsonl line 4"``, ``"data.parquet row 4"``."""
        return f"{self.path} {self._unit} {self._numbers[self._checked(idx)]}"

    def _checked(self, idx: int) -> int:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TypeError(f"FileRowDataset index must be an int, got {type(idx).__name__}")
        if not 0 <= idx < len(self._encoded):
            raise IndexError(f"FileRowDataset index {idx} out of range [0, {len(self._encoded)})")
        return idx


def build_file_dataset(
    config: DatasetConfig,
    rows: Iterable[tuple[int, object]],
    *,
    task_name: str,
    unit: str,
) -> FileRowDataset:
    """The dataset of ``rows``, ``(1-based number in the file, row)`` pairs read from ``config.path``.

    ``unit`` is what the numbers count (``"line"`` or ``"row"``), for messages.
    Raises :class:`DatasetFileError` naming the row and the field at the first
    bad row, and when the file holds no row.
    """
    path = file_path(config)
    numbers: list[int] = []
    encoded: list[bytes] = []
    for number, row in rows:
        place = RowPlace(path, unit, number)
        datum = row_datum(row, idx=len(encoded), task_name=task_name, config=config, place=place)
        encoded.append(_encode(datum, place))
        numbers.append(number)
    if not encoded:
        raise DatasetFileError(path, "holds no rows (a dataset needs at least one prompt)")
    return FileRowDataset(path, unit=unit, numbers=numbers, encoded=encoded)


def file_path(config: DatasetConfig) -> Path:
    """``dataset.path`` (config rules make a file dataset's path required)."""
    if config.path is None:
        raise ConfigError(
            f"dataset.kind={config.kind} reads its rows from a file: set dataset.path to that file"
        )
    return Path(config.path)


def _encode(datum: DatumSpec, place: RowPlace) -> bytes:
    try:
        return msgspec.json.encode(datum, order="sorted")
    except (msgspec.EncodeError, UnicodeError) as exc:
        # A lone surrogate (JSON's "\ud800" escape) is no character: UTF-8 cannot hold it.
        raise place.error(f"the row cannot be encoded as UTF-8 JSON: {exc}") from exc
