"""The reward function's identity, and the resume it refuses when the function's source changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir, run_identity
from rollvault.durable.compatibility import IncompatibleRunError
from rollvault.rewards import builtins
from rollvault.rewards.errors import RewardFunctionImportError, RewardFunctionSpecError
from rollvault.rewards.identity import reward_function_identity
from rollvault.rewards.spec import RewardFunctionKind

SOURCE = "def score(response_text, sample):\n    return 1.0\n"


def _config(tmp_path: Path, function: str | None, *extra: str) -> RunConfig:
    overrides = [
        "gate.kind=local_model",
        "trainer.kind=grpo",
        "dataset.kind=addition",
        f"model.path={tmp_path / 'no_model'}",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        *extra,
    ]
    if function is not None:
        overrides.append(f"reward.function={function}")
    return load_run_config(None, overrides)


def test_a_file_identity_is_its_path_and_digest_and_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text("raise SystemExit('imported!')\n" + SOURCE)  # would stop the test if run
    identity = reward_function_identity(f"{path}:score")
    assert identity.kind is RewardFunctionKind.FILE and identity.source == str(path)
    assert identity.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert identity.function == f"{path}:score"


def test_the_identity_is_stable_and_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text(SOURCE)
    first = reward_function_identity(f"{path}:score")
    assert reward_function_identity(f"{path}:score") == first
    path.write_text(SOURCE)  # rewritten, same bytes: same identity
    assert reward_function_identity(f"{path}:score") == first
    path.write_text(SOURCE.replace("1.0", "0.5"))
    assert reward_function_identity(f"{path}:score").source_sha256 != first.source_sha256


def test_a_module_identity_is_found_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "identity_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text("raise SystemExit('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    identity = reward_function_identity("identity_pkg.rewards:score")
    assert identity.source == str(package / "rewards.py")
    assert identity.source_sha256 == hashlib.sha256(b"raise SystemExit('imported!')\n").hexdigest()


def test_a_builtin_identity_is_the_builtins_module_source() -> None:
    identity = reward_function_identity("numeric_match")
    source = Path(builtins.__file__)
    assert identity.source == str(source.absolute())
    assert identity.source_sha256 == hashlib.sha256(source.read_bytes()).hexdigest()


def test_what_cannot_be_located_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionImportError, match="cannot read its source file"):
        reward_function_identity(f"{tmp_path / 'gone.py'}:score")
    with pytest.raises(RewardFunctionImportError, match="cannot locate module 'no_such_pkg_xyz'"):
        reward_function_identity("no_such_pkg_xyz:score")
    with pytest.raises(RewardFunctionImportError, match="has no source file") as info:
        reward_function_identity("sys:exit")
    assert isinstance(info.value, ConfigError)
    with pytest.raises(RewardFunctionSpecError):
        reward_function_identity("nonsense")


def test_the_run_identity_holds_the_function_and_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text(SOURCE)
    reward = run_identity(_config(tmp_path, f"{path}:score")).config["reward"]
    assert reward["function"] == f"{path}:score"
    assert reward["function_sha256"] == hashlib.sha256(SOURCE.encode()).hexdigest()
    assert "function_sha256" not in run_identity(_config(tmp_path, None)).config["reward"]


def test_a_changed_reward_file_refuses_the_resume_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text(SOURCE)
    config = _config(tmp_path, f"{path}:score")
    assert prepare_checkpoint_dir(config) is None  # a fresh run: the anchor is written
    old = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(SOURCE.replace("1.0", "0.5"))
    new = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(IncompatibleRunError) as info:
        prepare_checkpoint_dir(config)
    assert len(info.value.differences) == 1
    line = info.value.differences[0]
    assert line.startswith(f'reward.function_sha256: "{old[:20]}')
    assert f'-> "{new[:20]}' in line
    assert "reward.function_sha256" in str(info.value)
    # Back to the old code: the run resumes.
    path.write_text(SOURCE)
    prepare_checkpoint_dir(config)


def test_a_changed_function_or_pattern_refuses_the_resume(tmp_path: Path) -> None:
    prepare_checkpoint_dir(_config(tmp_path, "regex_format", "reward.format_regex=a+"))
    with pytest.raises(IncompatibleRunError) as info:
        prepare_checkpoint_dir(_config(tmp_path, "regex_format", "reward.format_regex=b+"))
    assert info.value.differences == ['reward.format_regex: "a+" -> "b+"']
    with pytest.raises(IncompatibleRunError) as info:
        prepare_checkpoint_dir(_config(tmp_path, "exact_match"))
    assert 'reward.function: "regex_format" -> "exact_match"' in info.value.differences
    # The digests are the same (one built-ins module): only the setting differs.
    assert not any("function_sha256" in line for line in info.value.differences)


def test_a_moved_reward_file_with_the_same_code_resumes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rewards.py").write_text(SOURCE)
    (tmp_path / "b" / "rewards.py").write_text(SOURCE)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path / "a")
        prepare_checkpoint_dir(_config(tmp_path, "rewards.py:score"))
        patch.chdir(tmp_path / "b")
        prepare_checkpoint_dir(_config(tmp_path, "rewards.py:score"))  # no refusal
        (tmp_path / "b" / "rewards.py").write_text(SOURCE + "# changed\n")
        with pytest.raises(IncompatibleRunError, match="reward.function_sha256"):
            prepare_checkpoint_dir(_config(tmp_path, "rewards.py:score"))
