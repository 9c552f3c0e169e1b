"""Opening a dataset file: it must be a regular, readable file."""

from __future__ import annotations

from pathlib import Path

from rollvault.tasks._file_rows.errors import DatasetFileError

__all__ = ["check_dataset_file", "read_dataset_file"]


def check_dataset_file(path: Path) -> None:
    """Refuse a path that is not an existing regular file (``dataset.path`` names it)."""
    if not path.exists():
        raise DatasetFileError(path, "no such file (dataset.path)")
    if not path.is_file():
        raise DatasetFileError(path, "not a regular file (dataset.path must name a file)")


def read_dataset_file(path: Path) -> bytes:
    """The file's bytes, or a :class:`DatasetFileError` saying why it cannot be read."""
    check_dataset_file(path)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetFileError(path, f"cannot be read: {exc}") from exc
