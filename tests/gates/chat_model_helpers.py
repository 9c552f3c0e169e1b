"""Builders of the gate tests: a ChatML-style character tokenizer and a tiny model over it."""

from __future__ import annotations

import json
from pathlib import Path

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.training.model_store import build_default_model
from rollvault.training.tokenizer import build_char_tokenizer

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_ALPHABET = "0123456789+-*= \nabcdefghijklmnopqrstuvwxyz:"
CHATML_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chatml_tokenizer() -> PreTrainedTokenizerBase:
    """The character tokenizer plus two special tokens and a ChatML template
    (an assistant turn ends with ``<|im_end|>``, which is not eos)."""
    tokenizer = build_char_tokenizer(CHAT_ALPHABET)
    tokenizer.add_tokens([IM_START, IM_END], special_tokens=True)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of one token (``convert_tokens_to_ids`` is typed for lists too)."""
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int), found
    return found


def chatml_model_dir(path: Path, *, generation_eos: list[int] | None = None) -> Path:
    """A tiny model over :func:`chatml_tokenizer` saved in ``path``; ``generation_eos``
    replaces its generation_config.json's eos_token_id."""
    tokenizer = chatml_tokenizer()
    build_default_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    if generation_eos is not None:
        config_path = path / "generation_config.json"
        config = json.loads(config_path.read_text())
        config["eos_token_id"] = generation_eos
        config_path.write_text(json.dumps(config))
    return path


def plain_model_dir(path: Path) -> Path:
    """A tiny model whose tokenizer has no chat template at all."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    build_default_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
