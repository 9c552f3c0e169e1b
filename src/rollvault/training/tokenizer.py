"""A character-level tokenizer for small tasks, built offline.

One token per character of an ASCII alphabet (``model.default_alphabet``)
plus three special tokens (``<pad>``, ``<eos>``, ``<unk>``). It saves with
``save_pretrained`` and loads back with ``AutoTokenizer.from_pretrained``
exactly like the tokenizer of any Hugging Face model.

It is built as the class transformers loads it as. The default model is a
Qwen2, and for ``model_type: qwen2`` ``AutoTokenizer`` always builds a
``Qwen2Tokenizer`` from the saved vocabulary, whatever pipeline the saved
``tokenizer.json`` describes: GPT-2 style byte-level pre-tokenization, then
BPE over the vocabulary (here with no merges, so one token per character).
Byte-level pre-tokenization spells a space ``Ġ``, a newline ``Ċ`` and a tab
``ĉ``, so the vocabulary holds each character under that spelling: then
whitespace is one token like any other character and decodes back to itself.
Printable ASCII spells itself, so the default alphabet's vocabulary (and its
ids) are what they always were. That BPE has no unknown token: a character
outside the alphabet is dropped, not turned into ``<unk>``; the alphabet
must cover the task's text. It is ASCII only because byte-level BPE would
split any other character into several bytes, none of them in the
vocabulary.

It carries a minimal chat template (:data:`CHAR_CHAT_TEMPLATE`), so
``model.chat_template: true`` works with the default model too: the
template joins the messages' contents and ends an assistant turn with eos.
It writes no role markers, since the alphabet has no tokens to spell them;
a single user message therefore renders to exactly its text.
"""

from __future__ import annotations

from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import DEFAULT_ALPHABET

__all__ = [
    "CHAR_CHAT_TEMPLATE",
    "DEFAULT_ALPHABET",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "build_char_tokenizer",
]

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
_SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)

CHAR_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- message['content'] -}}"
    "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)
"""Contents joined, eos after each assistant turn; no text of its own (see the module docstring)."""

_BYTE_SPELLING = bytes_to_unicode()


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerBase:
    """A tokenizer with ids 0, 1, 2 for pad, eos, unk, then one id per character
    in alphabet order, and :data:`CHAR_CHAT_TEMPLATE`.

    Raises ``ValueError`` for an empty alphabet, a repeated character or a
    character that is not ASCII.
    """
    if not alphabet:
        raise ValueError("build_char_tokenizer: the alphabet is empty")
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        raise ValueError(f"build_char_tokenizer: characters repeated in the alphabet: {repeated}")
    foreign = sorted({c for c in alphabet if not c.isascii()})
    if foreign:
        raise ValueError(f"build_char_tokenizer: characters that are not ASCII: {foreign}")
    spelled = (_BYTE_SPELLING[ord(c)] for c in alphabet)
    vocab = {token: index for index, token in enumerate((*_SPECIAL_TOKENS, *spelled))}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=UNK_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
    )
    tokenizer.chat_template = CHAR_CHAT_TEMPLATE
    return tokenizer
