"""Run config: defaults, YAML, overrides and every kind of error message."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from rollvault.config.errors import ConfigError
from rollvault.config.loading import config_to_dict, default_config_path, load_run_config
from rollvault.config.overrides import parse_override
from rollvault.config.schema import (
    OnDroppedPrompt,
    RecoveryGranularity,
    RestoreMode,
    RunConfig,
    SamplerKind,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_packaged_yaml_equals_struct_defaults() -> None:
    on_disk = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
    assert on_disk == config_to_dict(RunConfig())


def test_packaged_yaml_loads_to_defaults() -> None:
    assert load_run_config(default_config_path()) == RunConfig()


def test_no_file_and_empty_file_give_defaults(tmp_path: Path) -> None:
    assert load_run_config(None) == RunConfig()
    assert load_run_config(write(tmp_path, "# nothing\n")) == RunConfig()


def test_documented_defaults() -> None:
    config = RunConfig()
    assert config.grpo.num_prompts_per_step == 8
    assert config.sampler.kind is SamplerKind.IN_ORDER
    assert config.rollout.recovery_granularity is RecoveryGranularity.SIBLING
    assert config.rollout.on_dropped_prompt is OnDroppedPrompt.REPLACE
    assert config.rollout_checkpointing.restore_mode is RestoreMode.LATEST
    assert config.reward.advantage_epsilon == pytest.approx(1e-6)


def test_file_values_and_overrides_apply_in_order(tmp_path: Path) -> None:
    path = write(tmp_path, "grpo:\n  num_prompts_per_step: 4\nsampler:\n  kind: windowed\n")
    config = load_run_config(
        path,
        [
            "grpo.num_generations_per_prompt=16",
            "sampler.kind=in_order",
            "rollout.on_dropped_prompt=shrink",
            "logging.progress=false",
            "reward.advantage_epsilon=1e-5",
        ],
    )
    assert config.grpo.num_prompts_per_step == 4
    assert config.grpo.num_generations_per_prompt == 16
    assert config.sampler.kind is SamplerKind.IN_ORDER
    assert config.rollout.on_dropped_prompt is OnDroppedPrompt.SHRINK
    assert config.logging.progress is False
    assert config.reward.advantage_epsilon == pytest.approx(1e-5)
    # Everything not mentioned keeps its default.
    assert config.rollout.max_buffered_rollouts == RunConfig().rollout.max_buffered_rollouts


def test_later_override_wins() -> None:
    config = load_run_config(None, ["seed=1", "seed=7"])
    assert config.seed == 7


def test_int_override_accepted_for_float_field() -> None:
    assert (
        load_run_config(
            None, ["rollout_checkpointing.interval_s=3"]
        ).rollout_checkpointing.interval_s
        == 3.0
    )


def test_exponent_without_dot_is_a_float_in_files_too(tmp_path: Path) -> None:
    config = load_run_config(write(tmp_path, "reward:\n  advantage_epsilon: 1e-4\n"))
    assert config.reward.advantage_epsilon == pytest.approx(1e-4)


@pytest.mark.parametrize(
    ("text", "dotpath", "value"),
    [
        ("seed=3", "seed", 3),
        ("sampler.shuffle=false", "sampler.shuffle", False),
        ("logging.log_dir=/tmp/x y", "logging.log_dir", "/tmp/x y"),
        ("rollout.min_step_batch_fraction=0.25", "rollout.min_step_batch_fraction", 0.25),
        ("logging.log_dir='123'", "logging.log_dir", "123"),
        ("seed = 4", "seed", 4),
    ],
)
def test_parse_override(text: str, dotpath: str, value: object) -> None:
    assert parse_override(text) == (dotpath, value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("seed", "must look like dotted.key=value"),
        ("=3", "must look like dotted.key=value"),
        ("grpo..seed=3", "empty segment"),
        ("seed=[1, 2]", "must be a scalar"),
        ("seed={a: 1}", "must be a scalar"),
        ("grpo=3", "grpo is a section"),
        ("seed.x=3", "seed is a value, not a section"),
        ("seed=[", "not valid YAML"),
    ],
)
def test_malformed_override_is_rejected(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace(".", r"\.")):
        parse_override(text)


def test_typo_in_override_names_dotpath_and_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, ["grpo.num_prompt_per_step=4"])
    message = str(info.value)
    assert "'grpo.num_prompt_per_step'" in message
    assert "did you mean 'grpo.num_prompts_per_step'" in message
    assert "override 'grpo.num_prompt_per_step=4'" in message


def test_typo_in_section_name_suggests_section() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'gpro'; did you mean 'grpo'"):
        load_run_config(None, ["gpro.num_prompts_per_step=4"])


def test_leaf_in_wrong_section_suggests_full_dotpath() -> None:
    with pytest.raises(ConfigError, match="did you mean 'grpo.num_prompts_per_step'"):
        load_run_config(None, ["num_prompts_per_step=4"])


def test_typo_in_nested_file_key_names_full_dotpath(tmp_path: Path) -> None:
    path = write(tmp_path, "gate:\n  simulated:\n    vocab_sise: 100\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    message = str(info.value)
    assert "'gate.simulated.vocab_sise'" in message
    assert "did you mean 'gate.simulated.vocab_size'" in message
    assert str(path) in message


def test_unknown_key_without_close_match_still_lists_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(write(tmp_path, "dataset:\n  zzzzzz: 1\n"))
    message = str(info.value)
    assert "'dataset.zzzzzz'" in message
    assert "did you mean" not in message
    assert "dataset.num_prompts" in message


def test_wrong_type_names_dotpath_expected_type_and_origin() -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, ["grpo.max_num_steps=many"])
    message = str(info.value)
    assert "grpo.max_num_steps" in message
    assert "Expected `int`, got `str`" in message
    assert "override 'grpo.max_num_steps=many'" in message


def test_wrong_type_in_file_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "sampler:\n  shuffle: 3\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert "sampler.shuffle: Expected `bool`, got `int`" in str(info.value)
    assert str(path) in str(info.value)


def test_section_given_a_scalar_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="grpo: Expected `object`, got `int`"):
        load_run_config(write(tmp_path, "grpo: 3\n"))


def test_bad_enum_value_lists_choices_and_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, ["rollout.recovery_granularity=prompt-group"])
    message = str(info.value)
    assert "rollout.recovery_granularity" in message
    assert "expected one of: sibling, prompt_group" in message
    assert "did you mean 'prompt_group'" in message


@pytest.mark.parametrize(
    ("override", "dotpath", "bound"),
    [
        ("grpo.num_prompts_per_step=0", "grpo.num_prompts_per_step", ">= 1"),
        ("rollout.min_step_batch_fraction=0", "rollout.min_step_batch_fraction", "> 0.0"),
        ("rollout.min_step_batch_fraction=1.5", "rollout.min_step_batch_fraction", "<= 1.0"),
        (
            "gate.simulated.transient_failure_rate=-0.1",
            "gate.simulated.transient_failure_rate",
            ">= 0.0",
        ),
        ("sampler.max_lookahead_versions=-1", "sampler.max_lookahead_versions", ">= 0"),
        ("logging.log_dir=''", "logging.log_dir", "length >= 1"),
    ],
)
def test_out_of_range_value_names_dotpath_and_bound(
    override: str, dotpath: str, bound: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, [override])
    assert f"{dotpath}:" in str(info.value)
    assert bound in str(info.value)


def test_fraction_of_exactly_one_is_allowed() -> None:
    config = load_run_config(None, ["rollout.min_step_batch_fraction=1"])
    assert config.rollout.min_step_batch_fraction == 1.0


def test_buffer_smaller_than_a_step_names_both_fields() -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, ["grpo.num_prompts_per_step=16", "rollout.max_buffered_rollouts=8"])
    message = str(info.value)
    assert "rollout.max_buffered_rollouts (8)" in message
    assert "grpo.num_prompts_per_step (16)" in message


def test_buffer_equal_to_a_step_is_allowed() -> None:
    config = load_run_config(
        None, ["grpo.num_prompts_per_step=8", "rollout.max_buffered_rollouts=8"]
    )
    assert config.rollout.max_buffered_rollouts == 8


def test_every_cross_field_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(
            None,
            [
                "gate.simulated.median_response_tokens=1000",
                "gate.simulated.transient_failure_rate=0.6",
                "gate.simulated.permanent_failure_rate=0.5",
            ],
        )
    message = str(info.value)
    assert "gate.simulated.median_response_tokens (1000)" in message
    assert (
        "gate.simulated.transient_failure_rate + gate.simulated.permanent_failure_rate" in message
    )


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_run_config(write(tmp_path, "- 1\n- 2\n"))


def test_invalid_yaml_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "grpo: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_run_config(tmp_path / "absent.yaml")


def test_config_to_dict_is_plain_builtins_and_round_trips() -> None:
    config = load_run_config(None, ["sampler.kind=windowed", "seed=5"])
    as_dict = config_to_dict(config)
    assert as_dict["sampler"]["kind"] == "windowed"
    assert type(as_dict["sampler"]["kind"]) is str
    assert msgspec.json.decode(msgspec.json.encode(as_dict)) == as_dict
    assert msgspec.convert(as_dict, type=RunConfig, strict=True) == config


def test_config_is_immutable() -> None:
    config = RunConfig()
    with pytest.raises(AttributeError):
        config.seed = 3  # type: ignore[misc]


def test_misspelt_leaf_in_wrong_section_suggests_full_dotpath() -> None:
    with pytest.raises(ConfigError, match="did you mean 'rollout.max_inflight_prompts'"):
        load_run_config(None, ["grpo.max_inflight_prompt=4"])
