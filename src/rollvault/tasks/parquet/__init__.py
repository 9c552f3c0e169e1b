"""The parquet task: prompts from a Parquet file (``dataset.path``), scored by ``reward.function``.

Columns are fields: ``dataset.prompt_key`` names the prompt column (or
``dataset.messages_key`` a list-of-struct chat column), ``dataset.answer_key``
the answer. Every row is a prompt of each epoch. See
:mod:`rollvault.tasks._file_rows`.
"""

from rollvault.config.schema import DatasetConfig
from rollvault.tasks._file_rows import FileRowDataset, build_file_dataset, file_path
from rollvault.tasks.parquet.reader import read_parquet_rows
from rollvault.tasks.protocols import Task

__all__ = ["PARQUET_TASK_NAME", "TASK", "build_parquet_dataset"]

PARQUET_TASK_NAME = "parquet"


def build_parquet_dataset(config: DatasetConfig, *, seed: int, vocab_size: int) -> FileRowDataset:
    """The rows of ``config.path``; ``seed`` and ``vocab_size`` are unused (the file is the data)."""
    rows = read_parquet_rows(file_path(config))
    return build_file_dataset(config, rows, task_name=PARQUET_TASK_NAME, unit="row")


TASK = Task(name=PARQUET_TASK_NAME, build_dataset=build_parquet_dataset, needs_reward_function=True)
