"""A character-level tokenizer for small arithmetic tasks, built offline.

One token per character of a fixed alphabet plus three special tokens
(``<pad>``, ``<eos>``, ``<unk>``). It is made with the ``tokenizers`` library
and wrapped as a transformers fast tokenizer, so it saves with
``save_pretrained`` and loads back with ``AutoTokenizer.from_pretrained``
exactly like the tokenizer of any Hugging Face model.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = [
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

DEFAULT_ALPHABET = "0123456789+-*="
"""Digits and the operators of small arithmetic prompts. No whitespace: the
``Split`` pre-tokenizer drops it, so it could not round-trip."""


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A fast tokenizer with ids 0, 1, 2 for pad, eos, unk, then one id per character.

    Raises ``ValueError`` for an empty alphabet or a repeated character.
    """
    if not alphabet:
        raise ValueError("build_char_tokenizer: the alphabet is empty")
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        raise ValueError(f"build_char_tokenizer: characters repeated in the alphabet: {repeated}")
    vocab = {token: index for index, token in enumerate((*_SPECIAL_TOKENS, *alphabet))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split("") isolates every character, so each one is looked up on its own.
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    # Fuse joins the characters back without the spaces a WordLevel decoder inserts.
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
    )
