"""The addition task: two-digit sums, verified exactly (the real training recipe's)."""

from rollvault.tasks.addition.dataset import ADDITION_TASK_NAME, build_addition_dataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import Task
from rollvault.tasks.warmup import warmup_examples

__all__ = ["TASK"]

TASK = Task(
    name=ADDITION_TASK_NAME,
    build_dataset=build_addition_dataset,
    text_environment=AdditionEnvironment,
    warmup_examples=warmup_examples,
)
