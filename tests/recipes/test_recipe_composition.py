"""Composing a run: a gate the task cannot be scored on is refused before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollvault.config.schema import ConfigError, RunConfig, load_run_config
from rollvault.recipes.async_grpo import build_run_setup, warmup_examples
from rollvault.tasks.addition.dataset import build_addition_dataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import Task
from rollvault.tasks.registry import UnknownTaskError


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return load_run_config(
        None,
        [
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            *overrides,
        ],
    )


def test_a_model_gate_needs_a_text_environment(tmp_path: Path) -> None:
    config = _config(tmp_path, "gate.kind=local_model", "trainer.kind=grpo")
    with pytest.raises(ConfigError) as info:
        build_run_setup(config)
    assert str(info.value) == (
        "gate.kind=local_model needs a task with a text environment; "
        "dataset.kind=synthetic has none"
    )
    assert not (tmp_path / "model").exists(), "refused after building the model"


def test_the_simulated_gate_needs_a_token_environment(tmp_path: Path) -> None:
    config = _config(tmp_path, "dataset.kind=addition")
    with pytest.raises(
        ConfigError,
        match="gate.kind=simulated needs a task with a token environment; dataset.kind=addition has none",
    ):
        build_run_setup(config)


def test_a_warm_up_needs_warm_up_examples(tmp_path: Path) -> None:
    bare = Task(
        name="bare_addition",
        build_dataset=build_addition_dataset,
        text_environment=AdditionEnvironment,
    )
    config = _config(tmp_path, "trainer.warmup.steps=5")
    with pytest.raises(ConfigError) as info:
        warmup_examples(config, bare)
    assert str(info.value) == (
        "trainer.warmup.steps=5 needs warm-up examples; dataset.kind=bare_addition has none "
        "(set trainer.warmup.steps=0)"
    )
    assert warmup_examples(_config(tmp_path, "trainer.warmup.steps=0"), bare) is None


def test_an_unknown_task_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    config = _config(tmp_path, "dataset.kind=nope", "gate.kind=local_model", "trainer.kind=grpo")
    with pytest.raises(UnknownTaskError, match="dataset.kind='nope'"):
        build_run_setup(config)
    assert not (tmp_path / "model").exists()
