"""The synthetic task: seeded random token prompts scored by parity (the simulated gate's)."""

from rollvault.tasks.protocols import Task
from rollvault.tasks.synthetic.dataset import SYNTHETIC_TASK_NAME, build_synthetic_dataset
from rollvault.tasks.synthetic.environment import ParityEnvironment

__all__ = ["TASK"]

TASK = Task(
    name=SYNTHETIC_TASK_NAME,
    build_dataset=build_synthetic_dataset,
    token_environment=ParityEnvironment,
)
