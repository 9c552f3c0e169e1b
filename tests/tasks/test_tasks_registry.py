"""The task registry: tasks are found by folder, named like it, and a bad name says what exists."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import rollvault
import rollvault.tasks
from rollvault.config.errors import ConfigError
from rollvault.config.loading import config_to_dict, load_run_config
from rollvault.config.schema import DatasetConfig
from rollvault.tasks import addition, synthetic
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.protocols import Task
from rollvault.tasks.registry import (
    TaskDefinitionError,
    UnknownTaskError,
    build_dataset,
    get_task,
    known_tasks,
)
from rollvault.tasks.synthetic.dataset import build_synthetic_dataset
from rollvault.tasks.synthetic.environment import ParityEnvironment

CONFIGS = Path(rollvault.__file__).parent / "configs"


@pytest.fixture
def extra_task_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory searched as part of rollvault.tasks, so a test can add a task folder."""
    monkeypatch.setattr(rollvault.tasks, "__path__", [*rollvault.tasks.__path__, str(tmp_path)])
    known_tasks.cache_clear()
    yield tmp_path
    known_tasks.cache_clear()


def _write_task(root: Path, folder: str, body: str) -> None:
    (root / folder).mkdir()
    (root / folder / "__init__.py").write_text(textwrap.dedent(body), encoding="utf-8")


def test_the_built_in_tasks_are_found_by_their_folders() -> None:
    tasks = known_tasks()
    assert {"synthetic", "addition"} <= set(tasks)
    assert list(tasks) == sorted(tasks)
    assert tasks["synthetic"] is synthetic.TASK and tasks["addition"] is addition.TASK
    assert all(task.name == name for name, task in tasks.items())


def test_each_task_scores_at_its_level() -> None:
    assert synthetic.TASK.token_environment is not None
    assert synthetic.TASK.text_environment is None and synthetic.TASK.warmup_examples is None
    assert addition.TASK.text_environment is not None and addition.TASK.token_environment is None
    assert addition.TASK.warmup_examples is not None


def test_an_unknown_name_names_dataset_kind_the_value_and_the_known_tasks() -> None:
    with pytest.raises(UnknownTaskError) as info:
        get_task("additon")
    message = str(info.value)
    assert "dataset.kind='additon'" in message
    assert "synthetic" in message and "addition" in message
    assert "did you mean 'addition'?" in message
    assert isinstance(info.value, ConfigError)


def test_the_config_keeps_any_name_and_the_registry_checks_it() -> None:
    # The config layer is below the tasks: it cannot know them, so it accepts the string.
    config = load_run_config(None, ["dataset.kind=no_such_task"])
    assert config.dataset.kind == "no_such_task"
    with pytest.raises(UnknownTaskError, match="no_such_task"):
        build_dataset(config.dataset, vocab_size=8, seed=0)


def test_build_dataset_is_the_named_tasks_builder() -> None:
    built = build_dataset(DatasetConfig(kind="addition", num_prompts=7), vocab_size=99, seed=3)
    assert isinstance(built, AdditionPromptDataset)
    assert [built[i] for i in range(7)] == [AdditionPromptDataset(7, seed=3)[i] for i in range(7)]


def test_stored_configs_keep_the_same_kind_values() -> None:
    # Fingerprints and bootstrap identities hold config_to_dict: dataset.kind must stay
    # the plain string the enum used to serialize to, or old runs would be refused.
    for name, kind in (("default.yaml", "synthetic"), ("grpo_addition.yaml", "addition")):
        as_dict = config_to_dict(load_run_config(CONFIGS / name))
        assert as_dict["dataset"]["kind"] == kind and type(as_dict["dataset"]["kind"]) is str
        on_disk = yaml.safe_load((CONFIGS / name).read_text(encoding="utf-8"))
        assert on_disk["dataset"]["kind"] == kind


def test_a_new_folder_is_a_new_task(extra_task_folder: Path) -> None:
    _write_task(
        extra_task_folder,
        "echo_tokens",
        """
        from rollvault.tasks.protocols import Task
        from rollvault.tasks.synthetic.dataset import build_synthetic_dataset
        from rollvault.tasks.synthetic.environment import ParityEnvironment

        TASK = Task(
            name="echo_tokens",
            build_dataset=build_synthetic_dataset,
            token_environment=ParityEnvironment,
        )
        """,
    )
    _write_task(extra_task_folder, "_shared", "VALUE = 1\n")  # helpers, not a task
    tasks = known_tasks()
    assert "echo_tokens" in tasks and "_shared" not in tasks
    assert get_task("echo_tokens").build_dataset is build_synthetic_dataset


def test_a_folder_without_task_is_named(extra_task_folder: Path) -> None:
    _write_task(extra_task_folder, "half_done", "DATASET = None\n")
    with pytest.raises(TaskDefinitionError, match=r"half_done must export TASK.*NoneType"):
        known_tasks()


def test_a_task_named_unlike_its_folder_is_refused(extra_task_folder: Path) -> None:
    _write_task(
        extra_task_folder,
        "folder_name",
        """
        from rollvault.tasks.protocols import Task
        from rollvault.tasks.synthetic.dataset import build_synthetic_dataset
        from rollvault.tasks.synthetic.environment import ParityEnvironment

        TASK = Task(
            name="other_name",
            build_dataset=build_synthetic_dataset,
            token_environment=ParityEnvironment,
        )
        """,
    )
    with pytest.raises(TaskDefinitionError, match="'other_name'.*'folder_name'"):
        known_tasks()


def test_a_task_without_environment_is_refused() -> None:
    with pytest.raises(ValueError, match="'mute'.*token_environment or a text_environment"):
        Task(name="mute", build_dataset=build_synthetic_dataset)
    assert (
        Task(
            name="ok", build_dataset=build_synthetic_dataset, token_environment=ParityEnvironment
        ).text_environment
        is None
    )
