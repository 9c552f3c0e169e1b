"""The reverse task: write a digit string backwards (``"4721="`` -> ``"1274"``), verified exactly.

Added as this folder alone: the registry finds it, ``dataset.kind=reverse``
selects it, and ``configs/grpo_reverse.yaml`` is its GRPO recipe.
"""

from rollvault.tasks.protocols import Task
from rollvault.tasks.reverse.dataset import REVERSE_TASK_NAME, build_reverse_dataset
from rollvault.tasks.reverse.environment import ReverseEnvironment
from rollvault.tasks.warmup import warmup_examples

__all__ = ["TASK"]

TASK = Task(
    name=REVERSE_TASK_NAME,
    build_dataset=build_reverse_dataset,
    text_environment=ReverseEnvironment,
    warmup_examples=warmup_examples,
)
