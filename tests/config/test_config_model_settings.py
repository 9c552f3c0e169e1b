"""The model settings' config rules: alphabet, system prompt, dtype, sampling, micro-batches."""

from __future__ import annotations

import pytest

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import ModelDType


def test_model_settings_load_from_overrides() -> None:
    config = load_run_config(
        None,
        [
            "model.chat_template=true",
            "model.system_prompt=be brief",
            "model.dtype=bfloat16",
            "gate.local_model.top_p=0.9",
            "gate.local_model.top_k=5",
            "trainer.micro_batch_size=4",
        ],
    )
    assert config.model.chat_template and config.model.system_prompt == "be brief"
    assert config.model.dtype is ModelDType.BFLOAT16
    assert (config.gate.local_model.top_p, config.gate.local_model.top_k) == (0.9, 5)
    assert config.trainer.micro_batch_size == 4


def test_a_repeated_or_non_ascii_alphabet_character_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.default_alphabet repeats \['b'\]"):
        load_run_config(None, ["model.default_alphabet=abcb"])
    with pytest.raises(ConfigError, match=r"not ASCII \['é'\]"):
        load_run_config(None, ["model.default_alphabet=abé"])


def test_a_system_prompt_needs_the_chat_template() -> None:
    with pytest.raises(ConfigError, match=r"model\.system_prompt is set but model\.chat_template"):
        load_run_config(None, ["model.system_prompt=be brief"])


def test_chat_format_rows_need_the_chat_template() -> None:
    rows = ["dataset.kind=jsonl", "dataset.path=rows.jsonl", "dataset.messages_key=messages"]
    with pytest.raises(
        ConfigError, match=r"dataset\.messages_key='messages' .* model\.chat_template=true"
    ):
        load_run_config(None, rows)
    config = load_run_config(None, [*rows, "model.chat_template=true"])
    assert config.dataset.messages_key == "messages"


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("gate.local_model.top_p=0", "top_p"),
        ("gate.local_model.top_p=1.5", "top_p"),
        ("gate.local_model.top_k=-1", "top_k"),
        ("trainer.micro_batch_size=0", "micro_batch_size"),
        ("model.dtype=float16", "dtype"),
        ("model.default_alphabet=", "default_alphabet"),
    ],
)
def test_out_of_range_model_settings_name_the_field(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_run_config(None, [override])
