"""Prompt rendering: plain text as it is, or messages through the tokenizer's chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_model_helpers import IM_END, IM_START, chatml_tokenizer, plain_model_dir, token_id
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.gates.causal_lm import load_tokenizer
from rollvault.gates.errors import ModelDirError
from rollvault.gates.prompt_rendering import (
    PromptFormat,
    PromptRenderer,
    PromptRenderError,
    chat_messages,
    end_of_turn_token_id,
)
from rollvault.training.tokenizer import build_char_tokenizer

CHAT = PromptFormat(chat_template=True)
MODEL = Path("/models/m")


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def test_plain_prompts_are_tokenized_as_they_are() -> None:
    tokenizer = build_char_tokenizer()
    renderer = PromptRenderer(tokenizer, PromptFormat(), model_path=MODEL)
    assert renderer.prompt_ids({"prompt_text": "07+35="}) == _ids(tokenizer, "07+35=")
    assert renderer.end_of_turn_id is None
    assert renderer.answer_end_id == tokenizer.eos_token_id


def test_chat_messages_without_chat_template_are_a_data_error_naming_the_setting() -> None:
    renderer = PromptRenderer(build_char_tokenizer(), PromptFormat(), model_path=MODEL)
    datum = {"prompt_text": "1+1=", "messages": [{"role": "user", "content": "1+1="}]}
    with pytest.raises(PromptRenderError, match=r"model\.chat_template is false"):
        renderer.prompt_ids(datum)
    with pytest.raises(PromptRenderError, match="prompt_text"):
        renderer.prompt_ids({"idx": 3})


def test_chatml_renders_special_tokens_once_and_the_generation_prompt() -> None:
    tokenizer = chatml_tokenizer()
    start, end = token_id(tokenizer, IM_START), token_id(tokenizer, IM_END)
    renderer = PromptRenderer(
        tokenizer, PromptFormat(chat_template=True, system_prompt="be brief"), model_path=MODEL
    )
    ids = renderer.prompt_ids({"prompt_text": "1+2="})
    expected = (
        [start, *_ids(tokenizer, "system\nbe brief"), end, *_ids(tokenizer, "\n")]
        + [start, *_ids(tokenizer, "user\n1+2="), end, *_ids(tokenizer, "\n")]
        + [start, *_ids(tokenizer, "assistant\n")]
    )
    assert ids == expected
    assert ids.count(start) == 3 and tokenizer.eos_token_id not in ids
    assert renderer.end_of_turn_id == end == renderer.answer_end_id
    assert end != tokenizer.eos_token_id


def test_a_datum_system_message_replaces_the_configured_one() -> None:
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "ab"}]
    assert chat_messages({"messages": own}, "configured") == own
    assert chat_messages({"prompt_text": "ab"}, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "ab"},
    ]
    assert chat_messages({"prompt_text": "ab"}, None) == [{"role": "user", "content": "ab"}]
    # messages win over prompt_text when a datum has both.
    renderer = PromptRenderer(chatml_tokenizer(), CHAT, model_path=MODEL)
    text = chatml_tokenizer().decode(renderer.prompt_ids({"messages": own, "prompt_text": "zz"}))
    assert (
        text == f"{IM_START}system\nmine{IM_END}\n{IM_START}user\nab{IM_END}\n{IM_START}assistant\n"
    )


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a mapping"),
        ([{"role": "user"}], r"messages\[0\]\.content must be a string"),
        ([{"role": 3, "content": "a"}], r"messages\[0\]\.role must be a string"),
    ],
)
def test_malformed_messages_name_the_field(messages: object, fragment: str) -> None:
    renderer = PromptRenderer(chatml_tokenizer(), CHAT, model_path=MODEL)
    with pytest.raises(PromptRenderError, match=fragment):
        renderer.prompt_ids({"messages": messages})


def test_the_default_tokenizer_ships_a_minimal_template_ending_turns_with_eos() -> None:
    tokenizer = build_char_tokenizer()
    renderer = PromptRenderer(
        tokenizer, PromptFormat(chat_template=True, system_prompt="9"), model_path=MODEL
    )
    # No role markers (the alphabet cannot spell them): the contents, system first.
    assert renderer.prompt_ids({"prompt_text": "1+2="}) == _ids(tokenizer, "91+2=")
    assert end_of_turn_token_id(tokenizer) == tokenizer.eos_token_id


def test_a_tokenizer_without_a_template_is_refused_naming_model_path(tmp_path: Path) -> None:
    path = plain_model_dir(tmp_path / "plain")
    tokenizer = load_tokenizer(path)
    assert tokenizer.chat_template is None and end_of_turn_token_id(tokenizer) is None
    with pytest.raises(ModelDirError, match=r"model\.path") as info:
        PromptRenderer(tokenizer, CHAT, model_path=path)
    assert str(path) in str(info.value)
    # Without chat_template the same tokenizer is fine.
    assert PromptRenderer(tokenizer, PromptFormat(), model_path=path).prompt_ids(
        {"prompt_text": "1="}
    ) == _ids(tokenizer, "1=")


def test_an_end_of_turn_token_that_is_also_pad_still_ends_a_turn() -> None:
    # SmolLM2's pad, eos and <|im_end|> are one id; the turn's end must still be found.
    tokenizer = chatml_tokenizer()
    tokenizer.pad_token = IM_END
    assert tokenizer.pad_token_id == token_id(tokenizer, IM_END)
    assert end_of_turn_token_id(tokenizer) == token_id(tokenizer, IM_END)
