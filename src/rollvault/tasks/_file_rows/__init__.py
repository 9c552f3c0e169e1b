"""What the file tasks (``jsonl``, ``parquet``) share: rows to prompts, checks, the dataset.

Not a task (the registry skips folders starting with an underscore). Each
file task reads its format into ``(1-based number, row)`` pairs and hands
them to :func:`build_file_dataset`; the rest (what a row must hold, how it
becomes a prompt, the errors naming file, row and field) is here.
"""

from rollvault.tasks._file_rows.dataset import FileRowDataset, build_file_dataset, file_path
from rollvault.tasks._file_rows.errors import DatasetFileError, RowPlace
from rollvault.tasks._file_rows.files import check_dataset_file, read_dataset_file

__all__ = [
    "DatasetFileError",
    "FileRowDataset",
    "RowPlace",
    "build_file_dataset",
    "check_dataset_file",
    "file_path",
    "read_dataset_file",
]
