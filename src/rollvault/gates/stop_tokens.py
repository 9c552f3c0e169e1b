"""The tokens that end a response: eos, the model's generation config, the chat turn's end.

A chat model ends its turn with a token of its own (``<|im_end|>``,
``<|eot_id|>``), which is often not the tokenizer's eos; a model directory's
``generation_config.json`` may list several eos ids for the same reason.
Generation stops a row at the first token of the union, the token stays the
response's last (it is what the model chose, and its logprob is trained), and
the text the environment scores leaves it out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.gates.errors import ModelDirError

__all__ = ["GENERATION_CONFIG_FILENAME", "generation_config_eos_ids", "stop_token_ids"]

GENERATION_CONFIG_FILENAME = "generation_config.json"


_TokenId = Annotated[int, msgspec.Meta(ge=0)]


class _GenerationConfig(msgspec.Struct, frozen=True):
    # Every other field of the file is ignored (not forbidden): it is the model's, not ours.
    eos_token_id: _TokenId | list[_TokenId] | None = None


def generation_config_eos_ids(model_path: Path) -> list[int]:
    """The ``eos_token_id`` (an int or a list) of the model's generation config; [] if none."""
    path = model_path / GENERATION_CONFIG_FILENAME
    if not path.is_file():
        return []
    try:
        config = msgspec.json.decode(path.read_bytes(), type=_GenerationConfig)
    except msgspec.DecodeError as error:
        raise ModelDirError(f"{path}: cannot read eos_token_id: {error}") from error
    eos = config.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, model_path: Path, *, end_of_turn_id: int | None
) -> list[int]:
    """eos first, then the generation config's eos ids, then the end-of-turn token; no repeats."""
    candidates = [int(tokenizer.eos_token_id), *generation_config_eos_ids(model_path)]
    if end_of_turn_id is not None:
        candidates.append(end_of_turn_id)
    return list(dict.fromkeys(candidates))
