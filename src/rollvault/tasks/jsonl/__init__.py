"""The jsonl task: prompts from a JSONL file (``dataset.path``), scored by ``reward.function``.

One JSON object per line; ``dataset.prompt_key`` names the prompt field (or
``dataset.messages_key`` a chat), ``dataset.answer_key`` the answer. Every
row is a prompt of each epoch. See :mod:`rollvault.tasks._file_rows`.
"""

from rollvault.config.schema import DatasetConfig
from rollvault.tasks._file_rows import FileRowDataset, build_file_dataset, file_path
from rollvault.tasks.jsonl.reader import read_jsonl_rows
from rollvault.tasks.protocols import Task

__all__ = ["JSONL_TASK_NAME", "TASK", "build_jsonl_dataset"]

JSONL_TASK_NAME = "jsonl"


def build_jsonl_dataset(config: DatasetConfig, *, seed: int, vocab_size: int) -> FileRowDataset:
    """The rows of ``config.path``; ``seed`` and ``vocab_size`` are unused (the file is the data)."""
    rows = read_jsonl_rows(file_path(config))
    return build_file_dataset(config, rows, task_name=JSONL_TASK_NAME, unit="line")


TASK = Task(name=JSONL_TASK_NAME, build_dataset=build_jsonl_dataset, needs_reward_function=True)
