"""Compatibility identity, fingerprint, value formatting and config drift."""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import rollvault
from rollvault.durable.bootstrap import ensure_bootstrap_anchor
from rollvault.durable.compatibility import (
    _BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS,
    _EXCLUDED_PATH_REASONS,
    _MISSING,
    _REWARD_SEMANTIC_KEYS,
    BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION,
    BootstrapCompatibilityIdentity,
    _compatibility_differences,
    _format_changed_value,
    _normalize_capture_reward_config,
    bootstrap_compatibility_identity,
)
from rollvault.durable.config_paths import (
    _path_matches,
    canonical_config,
    format_dotpath,
    parse_pattern,
)
from rollvault.durable.errors import IncompatibleRunError

DEFAULT_YAML = Path(rollvault.__file__).parent / "configs" / "default.yaml"


def _default_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DEFAULT_YAML.read_text())
    return loaded


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    else:
        yield path, value


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return f"{value}-changed"


def _with_leaf(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


def _is_operational(path: tuple[str, ...]) -> bool:
    patterns = [parse_pattern(p) for p in _BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS]
    return any(_path_matches(p, path[:n]) for p in patterns for n in range(1, len(path) + 1))


def test_schema_version_constant_is_the_spec_value() -> None:
    assert BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION == 7


def test_every_excluded_pattern_is_documented_and_well_formed() -> None:
    assert set(_EXCLUDED_PATH_REASONS) == _BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS
    for pattern, reason in _EXCLUDED_PATH_REASONS.items():
        assert parse_pattern(pattern) and len(reason) > 10, pattern


def test_identity_drops_operational_paths_and_keeps_the_rest() -> None:
    config: dict[str, Any] = {
        "seed": 3,
        "logger": {"wandb": True},
        "policy": {"lr": 1e-6, "log_dir": "/a", "server": {"port": 1, "model": "m"}},
        "checkpointing": {"checkpoint_dir": "/c", "save_period": 5, "keep": 2},
        "cluster": {"num_nodes": 2},
        "envs": [{"port": 80, "name": "math", "num_workers": 4}],
    }
    identity = bootstrap_compatibility_identity(config)
    assert identity.schema_version == 7
    assert identity.excluded_paths == tuple(sorted(_BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS))
    assert identity.config == {
        "seed": 3,
        "policy": {"lr": 1e-6, "server": {"model": "m"}},
        "checkpointing": {"keep": 2},
        "envs": [{"name": "math"}],
    }
    assert config["policy"]["log_dir"] == "/a", "the input must not be modified"


def test_reward_block_is_projected_to_the_keys_that_change_rewards() -> None:
    dumped = {
        "reward": {"overlong_penalty": 0.5, "mask_overlong": True, "debug_dump": "x"},
        "seed": 1,
    }
    _normalize_capture_reward_config(dumped)
    assert dumped == {"reward": {"overlong_penalty": 0.5, "mask_overlong": True}, "seed": 1}
    untouched = {"reward": 3}
    _normalize_capture_reward_config(untouched)
    assert untouched == {"reward": 3}


def test_every_reward_key_of_the_default_config_takes_part_in_the_fingerprint() -> None:
    reward_keys = set(_default_config()["reward"])
    assert reward_keys <= set(_REWARD_SEMANTIC_KEYS), "a reward key would escape the fingerprint"


def test_fingerprint_is_sha256_of_canonical_json() -> None:
    identity = BootstrapCompatibilityIdentity(
        schema_version=7, excluded_paths=("b", "a"), config={"z": [1, 2.5, None], "é": True}
    )
    canonical = (
        '{"config":{"z":[1,2.5,null],"\\u00e9":true},"excluded_paths":["b","a"],"schema_version":7}'
    )
    assert identity.fingerprint() == hashlib.sha256(canonical.encode()).hexdigest()


def test_fingerprint_is_stable_across_processes_and_hash_seeds() -> None:
    config = {"b": {"y": 1, "x": [1, {"q": "r"}]}, "a": 0.1, "c": {str(i): i for i in range(50)}}
    here = bootstrap_compatibility_identity(config).fingerprint()
    script = (
        "from rollvault.durable.compatibility import bootstrap_compatibility_identity as b;"
        f"print(b({config!r}).fingerprint())"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == here


def test_fingerprint_sees_types_and_key_order_does_not_matter() -> None:
    def fp(config: dict[str, Any]) -> str:
        return bootstrap_compatibility_identity(config).fingerprint()

    assert fp({"a": 1, "b": 2}) == fp({"b": 2, "a": 1})
    assert len({fp({"a": 1}), fp({"a": 1.0}), fp({"a": True}), fp({"a": "1"})}) == 4
    assert fp({"a": (1, 2)}) == fp({"a": [1, 2]})


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({1: "x"}, TypeError, "config key 1 at <root> must be a string"),
        ({"a": {"b": float("nan")}}, ValueError, "config value at a.b is nan"),
        ({"a": [0, {"p": Path("/x")}]}, TypeError, "config value at a[1].p has type PosixPath"),
        ({"a": {1, 2}}, TypeError, "config value at a has type set"),
    ],
)
def test_values_json_cannot_hold_are_refused_naming_the_path(
    config: dict[Any, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        bootstrap_compatibility_identity(config)
    assert message in str(info.value)


def test_identity_refuses_a_non_mapping() -> None:
    with pytest.raises(TypeError, match="config must be a mapping, got list"):
        bootstrap_compatibility_identity([1])  # type: ignore[arg-type]


def test_canonical_config_turns_enums_into_plain_values() -> None:
    import enum

    class Kind(enum.StrEnum):
        A = "a"

    result = canonical_config({"k": Kind.A, "t": (1,)})
    assert result == {"k": "a", "t": [1]}
    assert type(result["k"]) is str


def test_format_dotpath() -> None:
    assert format_dotpath(("a", "b", "[2]", "c")) == "a.b[2].c"
    assert format_dotpath(("[0]",)) == "[0]"
    assert format_dotpath(()) == "<root>"


def test_format_changed_value() -> None:
    assert _format_changed_value(_MISSING) == "<missing>"
    assert _format_changed_value({"b": 1, "a": [True, None]}) == '{"a":[true,null],"b":1}'
    assert _format_changed_value("hunter2", redact=True) == "<redacted>"
    long = _format_changed_value("x" * 500)
    assert long.startswith('"xxx') and long.endswith("... (502 chars)") and len(long) < 80


@pytest.mark.parametrize(
    ("old", "new", "lines"),
    [
        ({"a": 1}, {"a": 1}, []),
        ({"a": {"b": 1}}, {"a": {"b": 2}}, ["a.b: 1 -> 2"]),
        ({"a": 1}, {"a": 1.0}, ["a: 1 -> 1.0"]),
        ({"a": 1}, {}, ["a: 1 -> <missing>"]),
        ({}, {"a": {"b": []}}, ['a: <missing> -> {"b":[]}']),
        ({"l": [1, 2, 3]}, {"l": [1, 5]}, ["l[1]: 2 -> 5", "l[2]: 3 -> <missing>"]),
        ({"l": [{"x": 1}]}, {"l": [{"x": 2}]}, ["l[0].x: 1 -> 2"]),
        ({"a": [1]}, {"a": {"0": 1}}, ['a: [1] -> {"0":1}']),
        ({"z": 1, "a": 1}, {"z": 2, "a": 2}, ["a: 1 -> 2", "z: 1 -> 2"]),
    ],
)
def test_compatibility_differences(old: Any, new: Any, lines: list[str]) -> None:
    assert _compatibility_differences(old, new) == lines


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_key", True),
        ("hf_token", True),
        ("password", True),
        ("db_password_file", True),
        ("client_secret_id", True),
        ("accessToken", True),
        ("max_tokens", False),
        ("token_budget", False),
        ("keep_latest_k", False),
        ("key_path", False),
        ("monkey", False),
    ],
)
def test_secret_looking_keys_are_redacted(key: str, secret: bool) -> None:
    [line] = _compatibility_differences({"s": {key: "old-value"}}, {"s": {key: "new-value"}})
    assert ("<redacted> -> <redacted>" in line) is secret
    assert ("old-value" in line) is not secret
    assert line.startswith(f"s.{key}: ")


def test_values_under_a_secret_key_are_redacted_too() -> None:
    [line] = _compatibility_differences({"secrets": {"a": "x"}}, {"secrets": {"a": "y"}})
    assert line == "secrets.a: <redacted> -> <redacted>"


def _anchor_for(tmp_path: Path, config: dict[str, Any]) -> Path:
    return ensure_bootstrap_anchor(
        tmp_path / "ckpt", identity=bootstrap_compatibility_identity(config)
    )


def test_config_drift_over_every_leaf_of_the_default_config(tmp_path: Path) -> None:
    config = _default_config()
    anchor = _anchor_for(tmp_path, config)
    operational = set()
    for path, value in _leaves(config):
        changed = bootstrap_compatibility_identity(_with_leaf(config, path, _changed(value)))
        dotpath = format_dotpath(path)
        if _is_operational(path):
            operational.add(dotpath)
            ensure_bootstrap_anchor(anchor.parent, identity=changed)
            continue
        with pytest.raises(IncompatibleRunError) as info:
            ensure_bootstrap_anchor(anchor.parent, identity=changed)
        assert info.value.differences == [
            f"{dotpath}: {_format_changed_value(value)} -> {_format_changed_value(_changed(value))}"
        ]
    assert {
        "logging.log_dir",
        "logging.progress",
        "checkpointing.checkpoint_dir",
        "checkpointing.save_period",
        "rollout_checkpointing.interval_s",
        "rollout_checkpointing.keep_latest_k",
        "rollout_checkpointing.max_consecutive_failures",
        "rollout_checkpointing.restore_mode",
        "rollout_checkpointing.shutdown_grace_s",
        "grpo.max_num_steps",
        "grpo.max_num_epochs",
        "rollout.max_inflight_prompts",
        "gate.local_model.max_batch_size",
        "model.path",
        "dataset.path",
    } <= operational
    assert "seed" not in operational and "reward.overlong_penalty" not in operational


def test_added_and_removed_operational_sections_pass(tmp_path: Path) -> None:
    config = {"grpo": {"lr": 1.0}, "logger": {"wandb": True}}
    anchor = _anchor_for(tmp_path, config)
    moved = {"grpo": {"lr": 1.0}, "cluster": {"num_nodes": 4}, "server": {"port": 9000}}
    ensure_bootstrap_anchor(anchor.parent, identity=bootstrap_compatibility_identity(moved))


def test_several_semantic_changes_are_all_named(tmp_path: Path) -> None:
    config = {"grpo": {"lr": 1.0, "n": 4}, "seed": 0, "data": ["a", "b"]}
    anchor = _anchor_for(tmp_path, config)
    changed = {"grpo": {"lr": 2.0}, "seed": 0, "data": ["a", "c"], "new": {"x": 1}}
    with pytest.raises(IncompatibleRunError) as info:
        ensure_bootstrap_anchor(anchor.parent, identity=bootstrap_compatibility_identity(changed))
    assert info.value.differences == [
        'data[1]: "b" -> "c"',
        "grpo.lr: 1.0 -> 2.0",
        "grpo.n: 4 -> <missing>",
        'new: <missing> -> {"x":1}',
    ]
    message = str(info.value)
    assert str(anchor) in message and "in 4 place(s)" in message
    assert all(f"  - {line}" in message for line in info.value.differences)
