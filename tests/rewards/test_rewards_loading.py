"""Loading ``reward.function``: every refusal names the setting, the module or file, the attribute."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rollvault.config.errors import ConfigError
from rollvault.config.schema import RewardConfig
from rollvault.rewards.errors import (
    RewardFunctionAttributeError,
    RewardFunctionImportError,
    RewardFunctionNotCallableError,
    RewardFunctionSignatureError,
    RewardFunctionSpecError,
)
from rollvault.rewards.loading import LoadedRewardFunction, file_module_name, load_reward_function
from rollvault.rewards.spec import parse_reward_function


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def _load(function: str, *, format_regex: str | None = None) -> LoadedRewardFunction:
    return load_reward_function(RewardConfig(function=function, format_regex=format_regex))


def test_a_file_function_loads_under_a_stable_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "rewards.py", "def score(response_text, sample):\n    return 1.0\n")
    loaded = _load(f"{path}:score")
    assert loaded.function("x", {}) == 1.0 and not loaded.is_async and not loaded.is_builtin
    name = file_module_name(loaded.spec)
    assert loaded.function.__module__ == name and sys.modules[name].__file__ == str(path)
    # The same file, given again (relative this time), has the same module name.
    monkeypatch.chdir(tmp_path)
    assert file_module_name(parse_reward_function("rewards.py:score")) == name
    other = _write(tmp_path / "other" / "rewards.py", "def score(r, s):\n    return 0.0\n")
    assert file_module_name(parse_reward_function(f"{other}:score")) != name


def test_a_relative_file_is_found_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "sub" / "r.py", "def score(response_text, sample):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    assert _load("sub/r.py:score").function("", {}) == 0.5


def test_a_module_function_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "user_pkg_ok" / "__init__.py", "")
    _write(
        tmp_path / "user_pkg_ok" / "rewards.py",
        "async def score(response_text, sample, *, scale=2.0):\n    return scale\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = _load("user_pkg_ok.rewards:score")
    assert loaded.is_async and loaded.function.__module__ == "user_pkg_ok.rewards"


def test_async_callables_and_defaults_are_accepted(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "r.py",
        """
        import functools

        class Scorer:
            async def __call__(self, response_text, sample):
                return 1.0

        scorer = Scorer()

        def flexible(*args, **kwargs):
            return 1.0

        def with_default(response_text, sample, extra=None):
            return 1.0

        def base(weight, response_text, sample):
            return weight

        partial = functools.partial(base, 3.0)
        """,
    )
    assert _load(f"{path}:scorer").is_async
    assert not _load(f"{path}:flexible").is_async
    assert not _load(f"{path}:with_default").is_async
    assert _load(f"{path}:partial").function("r", {}) == 3.0


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionImportError) as info:
        _load(f"{tmp_path / 'nope.py'}:score")
    message = str(info.value)
    assert message.startswith(f"reward.function='{tmp_path / 'nope.py'}:score'")
    assert f"file {tmp_path / 'nope.py'} does not exist" in message


def test_a_file_that_raises_on_import_is_refused_with_the_exception(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.py", "import math\nVALUE = 1 / 0\n")
    with pytest.raises(RewardFunctionImportError) as info:
        _load(f"{path}:score")
    assert str(info.value) == (
        f"reward.function='{path}:score': loading file {path} raised "
        "ZeroDivisionError: division by zero"
    )
    assert isinstance(info.value, ConfigError)
    assert file_module_name(parse_reward_function(f"{path}:score")) not in sys.modules


def test_a_file_with_a_syntax_error_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "syntax.py", "def score(response_text, sample)\n    return 1\n")
    with pytest.raises(RewardFunctionImportError, match=f"loading file {path} raised SyntaxError"):
        _load(f"{path}:score")


def test_a_module_that_cannot_be_imported_is_refused() -> None:
    with pytest.raises(RewardFunctionImportError) as info:
        _load("no_such_rollvault_pkg.rewards:score")
    message = str(info.value)
    assert message.startswith("reward.function='no_such_rollvault_pkg.rewards:score': ")
    assert "cannot import module 'no_such_rollvault_pkg.rewards'" in message
    assert "ModuleNotFoundError: No module named 'no_such_rollvault_pkg'" in message
    assert "PYTHONPATH" in message


def test_a_module_that_raises_on_import_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "user_mod_raises.py", "raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardFunctionImportError) as info:
        _load("user_mod_raises:score")
    assert str(info.value) == (
        "reward.function='user_mod_raises:score': importing module 'user_mod_raises' raised "
        "RuntimeError: needs a GPU"
    )


def test_a_missing_attribute_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.py", "def score(response_text, sample):\n    return 1.0\n")
    with pytest.raises(RewardFunctionAttributeError) as info:
        _load(f"{path}:scor")
    assert str(info.value) == (
        f"reward.function='{path}:scor': file {path} has no attribute 'scor'; did you mean 'score'?"
    )


def test_a_missing_attribute_of_a_module_names_the_module() -> None:
    with pytest.raises(RewardFunctionAttributeError) as info:
        _load("json:not_there")
    assert str(info.value) == (
        "reward.function='json:not_there': module 'json' has no attribute 'not_there'"
    )


def test_something_not_callable_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.py", "score = 0.5\n")
    with pytest.raises(RewardFunctionNotCallableError) as info:
        _load(f"{path}:score")
    assert str(info.value) == (
        f"reward.function='{path}:score': 'score' in file {path} is a float, not a function"
    )


@pytest.mark.parametrize(
    ("definition", "signature"),
    [
        ("def score(response_text):\n    return 1.0\n", "(response_text)"),
        ("def score(a, b, c):\n    return 1.0\n", "(a, b, c)"),
        ("def score(response_text, *, sample):\n    return 1.0\n", "(response_text, *, sample)"),
        ("def score():\n    return 1.0\n", "()"),
    ],
)
def test_a_wrong_signature_is_refused(tmp_path: Path, definition: str, signature: str) -> None:
    path = _write(tmp_path / "r.py", definition)
    with pytest.raises(RewardFunctionSignatureError) as info:
        _load(f"{path}:score")
    message = str(info.value)
    assert message.startswith(
        f"reward.function='{path}:score': score{signature} in file {path} cannot be called "
        "as score(response_text, sample): "
    )


def test_builtins_load_and_regex_format_needs_its_pattern() -> None:
    loaded = _load("numeric_match")
    assert loaded.is_builtin and not loaded.is_async
    assert loaded.function("so 42", {"answer": "42"})["correct"] is True
    regex = _load("regex_format", format_regex=r"\d+")
    assert regex.function("123", {})["reward"] == 1.0
    with pytest.raises(
        RewardFunctionSpecError, match="regex_format built-in needs reward.format_regex"
    ):
        _load("regex_format")
    with pytest.raises(RewardFunctionSpecError, match="reward.function is not set"):
        load_reward_function(RewardConfig())
