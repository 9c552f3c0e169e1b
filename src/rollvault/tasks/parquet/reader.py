"""Parquet rows, read with pyarrow (local files only; nothing is fetched).

Rows are numbered from 1 in file order, across row groups; messages and
resume checks name the row number. Nested columns (lists, structs) become
lists and mappings; dates, times and timestamps become ISO 8601 strings and
decimals their digits (:mod:`rollvault.tasks._file_rows.values`); nulls are
None.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow
import pyarrow.parquet

from rollvault.tasks._file_rows import DatasetFileError, check_dataset_file

__all__ = ["read_parquet_rows"]


def read_parquet_rows(path: Path) -> Iterator[tuple[int, object]]:
    """``(row number, row as a dict)`` of every row of the Parquet file ``path``."""
    check_dataset_file(path)
    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as exc:
        raise DatasetFileError(path, f"not a readable Parquet file: {exc}") from exc
    # One row group at a time: the Python objects of a large file are not all made at once.
    number = 0
    for batch in table.to_batches():
        for row in batch.to_pylist():
            number += 1
            yield number, row
