"""The guessing game: a built-in multi-turn task (hidden digit, higher/lower feedback)."""

from rollvault.tasks.guess.dataset import GUESS_TASK_NAME, build_guess_dataset
from rollvault.tasks.guess.environment import GuessEnvironment
from rollvault.tasks.guess.warmup import guess_warmup_examples
from rollvault.tasks.protocols import Task

__all__ = ["TASK"]

TASK = Task(
    name=GUESS_TASK_NAME,
    build_dataset=build_guess_dataset,
    episode_environment=GuessEnvironment,
    warmup_examples=guess_warmup_examples,
)
