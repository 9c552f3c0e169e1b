"""Parsing ``reward.function``: built-in names, ``module:function``, ``path.py:function``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollvault.config.errors import ConfigError
from rollvault.rewards.builtins import builtin_reward_function
from rollvault.rewards.errors import RewardFunctionSpecError
from rollvault.rewards.spec import (
    BUILTIN_REWARD_FUNCTIONS,
    RewardFunctionKind,
    parse_reward_function,
)


@pytest.mark.parametrize("name", BUILTIN_REWARD_FUNCTIONS)
def test_builtin_names(name: str) -> None:
    spec = parse_reward_function(name)
    assert (spec.kind, spec.target, spec.attribute, spec.text) == (
        RewardFunctionKind.BUILTIN,
        name,
        name,
        name,
    )
    # Every name the parser accepts is one the built-ins module provides.
    assert callable(builtin_reward_function(name, format_regex="x"))


@pytest.mark.parametrize(
    ("text", "target", "attribute"),
    [
        ("my_pkg.rewards:score", "my_pkg.rewards", "score"),
        ("rewards:score_v2", "rewards", "score_v2"),
        ("a.b.c:_private", "a.b.c", "_private"),
    ],
)
def test_module_specs(text: str, target: str, attribute: str) -> None:
    spec = parse_reward_function(text)
    assert (spec.kind, spec.target, spec.attribute) == (
        RewardFunctionKind.MODULE,
        target,
        attribute,
    )


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("rewards.py:score", "rewards.py"),
        ("path/to/rewards.py:score", "path/to/rewards.py"),
        ("/abs/dir.with.dots/r.py:score", "/abs/dir.with.dots/r.py"),
        ("../up/r.py:score", "../up/r.py"),
    ],
)
def test_file_specs(text: str, target: str) -> None:
    spec = parse_reward_function(text)
    assert (spec.kind, spec.target, spec.attribute) == (RewardFunctionKind.FILE, target, "score")


def test_a_relative_file_is_taken_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_reward_function("sub/r.py:score").file_path() == tmp_path / "sub" / "r.py"
    assert parse_reward_function("/x/r.py:score").file_path() == Path("/x/r.py")
    with pytest.raises(ValueError, match="names a module, not a file"):
        parse_reward_function("pkg:score").file_path()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "reward.function='' is empty"),
        ("   ", "reward.function='   ' is empty"),
        (
            "exact_mach",
            "names no built-in reward function and has no ':'; .*did you mean 'exact_match'",
        ),
        ("score", "names no built-in reward function"),
        (":score", "has nothing before ':'"),
        ("pkg.rewards:", r"the function name after the last ':' \(''\) is not a Python identifier"),
        ("pkg.rewards: score", r"\(' score'\) is not a Python identifier"),
        ("pkg.rewards:score-v2", "is not a Python identifier"),
        ("my-pkg.rewards:score", "'my-pkg.rewards' is neither a dotted module name nor a path"),
        ("pkg..rewards:score", "neither a dotted module name"),
        ("dir/rewards.txt:score", "the file 'dir/rewards.txt' must be a Python file ending in .py"),
    ],
)
def test_malformed_settings_are_refused_naming_the_setting(text: str, expected: str) -> None:
    with pytest.raises(RewardFunctionSpecError, match=expected) as info:
        parse_reward_function(text)
    assert isinstance(info.value, ConfigError)  # rollvault run: exit 2 before anything runs
    assert str(info.value).startswith(f"reward.function={text!r}")
    assert "module:function" in str(info.value)  # every refusal shows the accepted forms
