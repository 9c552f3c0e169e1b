"""Which environment a run scores with, and the settings refused before the run starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollvault.cli.main import main
from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.durable.run_lock import RUN_LOCK_FILENAME
from rollvault.recipes.async_grpo import prepare, text_environment
from rollvault.rewards.environment import RewardFunctionEnvironment
from rollvault.rewards.errors import RewardFunctionSignatureError
from rollvault.tasks.addition.dataset import build_addition_dataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import Task
from rollvault.tasks.registry import get_task

MODEL_RUN = ("gate.kind=local_model", "trainer.kind=grpo", "dataset.kind=addition")


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


def test_a_reward_function_needs_a_text_gate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, "reward.function=exact_match")
    assert "reward.function='exact_match' needs a gate that generates text" in str(info.value)
    assert "gate.kind=local_model" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("reward.function=regex_format",),
            "reward.function=regex_format needs reward.format_regex",
        ),
        (
            ("reward.function=regex_format", "reward.format_regex=(unclosed"),
            "reward.format_regex='(unclosed' is not a valid regex: missing ), unterminated subpattern",
        ),
        (
            ("reward.function=exact_match", "reward.format_regex=a+"),
            "reward.format_regex is set but reward.function is 'exact_match'; only the "
            "regex_format built-in uses it",
        ),
        (("reward.format_regex=a+",), "reward.format_regex is set but reward.function is None"),
    ],
)
def test_regex_format_needs_a_valid_pattern_and_only_it_takes_one(
    tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, *MODEL_RUN, *overrides)
    assert message in str(info.value)
    _config(tmp_path, *MODEL_RUN, "reward.function=regex_format", r"reward.format_regex=\d+")


def test_a_reward_function_replaces_the_tasks_own_scoring(tmp_path: Path) -> None:
    task = get_task("addition")
    assert isinstance(text_environment(_config(tmp_path, *MODEL_RUN), task), AdditionEnvironment)
    chosen = text_environment(_config(tmp_path, *MODEL_RUN, "reward.function=numeric_match"), task)
    assert isinstance(chosen, RewardFunctionEnvironment)
    assert chosen.loaded.spec.text == "numeric_match"


def test_a_task_without_scoring_needs_a_reward_function(tmp_path: Path) -> None:
    bare = Task(name="my_file", build_dataset=build_addition_dataset, needs_reward_function=True)
    with pytest.raises(ConfigError) as info:
        text_environment(_config(tmp_path, *MODEL_RUN), bare)
    assert str(info.value) == (
        "dataset.kind=my_file has no built-in scoring; set reward.function (a built-in: "
        "exact_match, numeric_match, regex_format, or module:function / path.py:function)"
    )
    config = _config(tmp_path, *MODEL_RUN, "reward.function=exact_match")
    assert isinstance(text_environment(config, bare), RewardFunctionEnvironment)
    with pytest.raises(ValueError, match="or set needs_reward_function"):
        Task(name="unscored", build_dataset=build_addition_dataset)


def test_a_bad_function_is_refused_before_the_model_is_built(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text("def score(response_text):\n    return 1.0\n")
    with pytest.raises(RewardFunctionSignatureError, match="cannot be called as score"):
        prepare(_config(tmp_path, *MODEL_RUN, f"reward.function={path}:score"))
    assert not (tmp_path / "model").exists()


def test_rollvault_run_refuses_a_function_that_cannot_be_imported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rewards.py"
    path.write_text("import not_installed_anywhere_xyz\n")
    argv = [
        "run",
        *MODEL_RUN,
        f"reward.function={path}:score",
        f"model.path={tmp_path / 'model'}",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"cannot start: reward.function='{path}:score': loading file {path} raised "
        "ModuleNotFoundError: No module named 'not_installed_anywhere_xyz'"
    ) in err
    # Refused before anything was written but the run lock, which the start takes first.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [RUN_LOCK_FILENAME]
    assert not (tmp_path / "model").exists()
