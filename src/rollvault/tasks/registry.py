"""Every task, by the name ``dataset.kind`` gives it, found among the folders of this package.

A task is a subpackage of :mod:`rollvault.tasks` that exports ``TASK``, a
:class:`~rollvault.tasks.protocols.Task` named like its folder. Nothing lists
the tasks: adding one is adding its folder. Folders whose name starts with an
underscore are skipped (shared helpers, not tasks).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from rollvault.config.errors import ConfigError
from rollvault.config.schema import DatasetConfig
from rollvault.tasks.protocols import PromptDataset, Task

__all__ = [
    "TASK_ATTRIBUTE",
    "TaskDefinitionError",
    "UnknownTaskError",
    "build_dataset",
    "get_task",
    "known_tasks",
]

TASK_ATTRIBUTE = "TASK"
_TASKS_PACKAGE = "rollvault.tasks"


class UnknownTaskError(ConfigError):
    """``dataset.kind`` names no task."""


class TaskDefinitionError(TypeError):
    """A task folder does not export a well-formed ``TASK`` (a bug of that folder)."""


def get_task(name: str) -> Task:
    """The task ``dataset.kind=name`` selects; :class:`UnknownTaskError` names the known ones."""
    tasks = known_tasks()
    task = tasks.get(name)
    if task is None:
        message = f"dataset.kind={name!r} names no task (known tasks: {', '.join(tasks)})"
        close = difflib.get_close_matches(name, list(tasks), n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise UnknownTaskError(message)
    return task


@functools.cache
def known_tasks() -> Mapping[str, Task]:
    """Every task folder's ``TASK``, by name, sorted (imported once per process)."""
    package = importlib.import_module(_TASKS_PACKAGE)
    tasks: dict[str, Task] = {}
    for info in pkgutil.iter_modules(package.__path__, prefix=f"{_TASKS_PACKAGE}."):
        folder = info.name.rsplit(".", 1)[-1]
        if info.ispkg and not folder.startswith("_"):
            tasks[folder] = _task_of(info.name, folder)
    return MappingProxyType(dict(sorted(tasks.items())))


def _task_of(module_name: str, folder: str) -> Task:
    task = getattr(importlib.import_module(module_name), TASK_ATTRIBUTE, None)
    if not isinstance(task, Task):
        raise TaskDefinitionError(
            f"{module_name} must export {TASK_ATTRIBUTE}, a rollvault.tasks.protocols.Task; "
            f"got {type(task).__name__}"
        )
    if task.name != folder:
        raise TaskDefinitionError(
            f"{module_name}.{TASK_ATTRIBUTE}.name is {task.name!r}; it must be the folder's "
            f"name {folder!r}, which is what dataset.kind selects"
        )
    return task


def build_dataset(config: DatasetConfig, *, vocab_size: int, seed: int) -> PromptDataset:
    """The dataset of the task ``config.kind`` names (see :class:`~rollvault.tasks.protocols.DatasetBuilder`)."""
    return get_task(config.kind).build_dataset(config, seed=seed, vocab_size=vocab_size)
