"""A prompt as the token ids a model generates from: plain text, or the tokenizer's chat template.

Without ``model.chat_template`` a datum's ``prompt_text`` is tokenized as it
is (no special tokens added), as every run did before chat templates. With
it, the datum's ``messages`` (a list of ``{"role", "content"}``), or else its
``prompt_text`` as one user message, are rendered by the tokenizer's chat
template with the generation prompt (the start of an assistant turn)
appended, ``model.system_prompt`` first unless the datum brings its own
system message. ``apply_chat_template`` tokenizes what the template rendered
without adding special tokens (transformers 5), so the template's own
special tokens (``<|im_start|>`` ...) appear exactly once.

A datum that cannot be rendered raises :class:`PromptRenderError`: the gate
fails that attempt as a data failure, naming the field. A tokenizer without a
chat template under ``chat_template: true`` is refused when the renderer is
built (:class:`~rollvault.gates.errors.ModelDirError` naming ``model.path``),
before any attempt runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec
from jinja2.exceptions import TemplateError
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelConfig
from rollvault.gates.errors import ModelDirError

__all__ = [
    "MESSAGES_KEY",
    "PROMPT_TEXT_KEY",
    "PromptFormat",
    "PromptRenderError",
    "PromptRenderer",
    "chat_messages",
    "end_of_turn_token_id",
    "require_chat_template",
]

MESSAGES_KEY = "messages"
"""The datum field of a chat-format prompt: a list of ``{"role", "content"}``."""
PROMPT_TEXT_KEY = "prompt_text"
"""The datum field of a plain text prompt."""

_PROBE = "rollvault-end-of-turn-probe"


class PromptFormat(msgspec.Struct, frozen=True, kw_only=True):
    """How prompts are rendered (``model.chat_template`` and ``model.system_prompt``)."""

    chat_template: bool = False
    system_prompt: str | None = None

    @classmethod
    def from_config(cls, model: ModelConfig) -> PromptFormat:
        return cls(chat_template=model.chat_template, system_prompt=model.system_prompt)


class PromptRenderError(ValueError):
    """A datum cannot be rendered into prompt tokens (bad or missing field)."""


def require_chat_template(tokenizer: PreTrainedTokenizerBase, model_path: Path) -> None:
    """Raise :class:`ModelDirError` when ``tokenizer`` has no chat template."""
    if not tokenizer.chat_template:
        raise ModelDirError(
            f"model.chat_template is true but the tokenizer in {model_path} (model.path) has no "
            "chat template (tokenizer_config.json or chat_template.jinja); set "
            "model.chat_template=false to tokenize prompt_text as it is"
        )


def chat_messages(prompt: Mapping[str, object], system_prompt: str | None) -> list[dict[str, str]]:
    """The conversation to render for ``prompt``: its messages, or its text as a user turn."""
    messages = _datum_messages(prompt) if MESSAGES_KEY in prompt else None
    if messages is None:
        messages = [{"role": "user", "content": _prompt_text(prompt)}]
    if system_prompt is not None and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def end_of_turn_token_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token the chat template closes an assistant turn with, if it has one.

    Found by rendering a one-exchange conversation and tokenizing what the
    template writes right after the assistant's content (``<|im_end|>`` for
    ChatML, ``<|eot_id|>`` for Llama 3, eos for many others). None when that
    is not a special token, or there is no template or it cannot render such a
    conversation.
    """
    if not tokenizer.chat_template:
        return None
    conversation = [
        {"role": "user", "content": "probe"},
        {"role": "assistant", "content": _PROBE},
    ]
    try:
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    except TemplateError:
        return None  # e.g. a template that raises for this conversation's shape
    if not isinstance(rendered, str) or _PROBE not in rendered:
        return None
    after = rendered.split(_PROBE, 1)[1]
    ids = list(tokenizer(after, add_special_tokens=False).input_ids) if after else []
    if not ids or ids[0] not in _special_ids(tokenizer):
        return None
    return int(ids[0])


class PromptRenderer:
    """Renders data into prompt token ids for one tokenizer and :class:`PromptFormat`."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat, *, model_path: Path
    ) -> None:
        if prompt_format.chat_template:
            require_chat_template(tokenizer, model_path)
        self._tokenizer = tokenizer
        self._format = prompt_format
        self.end_of_turn_id = (
            end_of_turn_token_id(tokenizer) if prompt_format.chat_template else None
        )
        """The template's end-of-turn token (None without chat_template, or if it has none)."""

    @property
    def prompt_format(self) -> PromptFormat:
        return self._format

    @property
    def answer_end_id(self) -> int:
        """The token that ends a response: the end-of-turn token with a chat template, else eos."""
        if self.end_of_turn_id is not None:
            return self.end_of_turn_id
        return int(self._tokenizer.eos_token_id)

    def prompt_ids(self, prompt: Mapping[str, object]) -> list[int]:
        """The token ids to generate after; raises :class:`PromptRenderError`."""
        if not self._format.chat_template:
            if MESSAGES_KEY in prompt:
                raise PromptRenderError(
                    f"the prompt has chat {MESSAGES_KEY!r} but model.chat_template is false "
                    "(set model.chat_template=true to render them with the tokenizer's chat "
                    "template)"
                )
            ids = list(self._tokenizer(_prompt_text(prompt), add_special_tokens=False).input_ids)
        else:
            ids = self._rendered_ids(chat_messages(prompt, self._format.system_prompt))
        if not ids:
            raise PromptRenderError("the prompt has no tokens")
        return [int(i) for i in ids]

    def _rendered_ids(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            ids = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except TemplateError as error:
            raise PromptRenderError(
                f"the chat template cannot render the prompt: {error}"
            ) from error
        checked = [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
        if not isinstance(ids, list) or len(checked) != len(ids):
            raise TypeError(f"apply_chat_template returned {type(ids).__name__}, not a list of ids")
        return checked


def _prompt_text(prompt: Mapping[str, object]) -> str:
    text = prompt.get(PROMPT_TEXT_KEY)
    if not isinstance(text, str) or not text:
        raise PromptRenderError(
            f"the prompt has no {PROMPT_TEXT_KEY} (a non-empty string) to generate from, "
            f"got {type(text).__name__}"
        )
    return text


def _datum_messages(prompt: Mapping[str, object]) -> list[dict[str, str]]:
    messages = prompt[MESSAGES_KEY]
    if not isinstance(messages, list) or not messages:
        raise PromptRenderError(
            f"the prompt's {MESSAGES_KEY!r} must be a non-empty list of {{role, content}}, "
            f"got {type(messages).__name__}"
        )
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise PromptRenderError(
                f"{MESSAGES_KEY}[{index}] must be a mapping with role and content, "
                f"got {type(message).__name__}"
            )
        fields = {}
        for field in ("role", "content"):
            value = message.get(field)
            if not isinstance(value, str):
                raise PromptRenderError(
                    f"{MESSAGES_KEY}[{index}].{field} must be a string, got {type(value).__name__}"
                )
            fields[field] = value
        checked.append(fields)
    return checked


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of the special and added tokens (a template's control tokens are among them),
    less unk (what a character outside a small vocabulary becomes).

    Pad stays: many chat models pad with their end-of-turn token (SmolLM2's pad,
    eos and ``<|im_end|>`` are one id), and that token must still end a turn.
    """
    ids = {int(i) for i in tokenizer.all_special_ids} | {
        int(i) for i in tokenizer.added_tokens_decoder
    }
    return ids - {tokenizer.unk_token_id}
