"""The run's model directory: build the default model once, load any model the same way.

The default model is a tiny Qwen2-style causal LM (2 layers, hidden size 128,
about 0.5 M parameters) over the character-level tokenizer of
:mod:`rollvault.training.tokenizer` (its alphabet is ``model.default_alphabet``). It is built offline, seeded, and saved
with ``save_pretrained`` on the first start; every start then loads the
directory with :func:`rollvault.gates.causal_lm.load_causal_lm`, the code path
a user's own Hugging Face model directory takes too. The directory is written
under a temporary name and renamed into place, so a crash never leaves a
half-written model where a later start would load it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import DEFAULT_ALPHABET, ModelDType
from rollvault.gates.causal_lm import (
    ModelDirError,
    load_causal_lm,
    load_tokenizer,
    quiet_transformers,
)
from rollvault.training.tokenizer import build_char_tokenizer

__all__ = [
    "ModelDirError",
    "build_default_model",
    "ensure_model_dir",
    "load_model_dir",
]

_TMP_PREFIX = "tmp_model_"


def build_default_model(tokenizer: PreTrainedTokenizerBase, *, seed: int) -> Qwen2ForCausalLM:
    """The default tiny Qwen2-style model for ``tokenizer``, initialised from ``seed``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    # Initialise from a private generator state so building the model does not
    # depend on, or disturb, whatever else used torch's global RNG before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    return model


def ensure_model_dir(
    path: Path, *, build_default: bool, seed: int, alphabet: str = DEFAULT_ALPHABET
) -> Path:
    """Return ``path`` once it holds a model; build the default there if it holds nothing.

    The default model's tokenizer knows the characters of ``alphabet``; a
    directory that already holds a model is returned as it is.

    Raises :class:`ModelDirError` when ``path`` is missing and ``build_default``
    is false, or when it holds files that are not a model.
    """
    if (path / "config.json").is_file():
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ModelDirError(f"{path} exists but holds no model (no config.json)")
    if not build_default:
        raise ModelDirError(
            f"model directory {path} does not exist (set model.build_default=true to build "
            "the default tiny model there)"
        )
    _publish_default_model(path, seed=seed, alphabet=alphabet)
    return path


def load_model_dir(
    path: Path, *, dtype: ModelDType = ModelDType.FLOAT32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in ``dtype``) and tokenizer saved in ``path`` (any local Hugging Face
    causal LM)."""
    return load_causal_lm(path, dtype=dtype), load_tokenizer(path)


def _publish_default_model(path: Path, *, seed: int, alphabet: str) -> None:
    quiet_transformers()
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{_TMP_PREFIX}{path.name}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a start that died while building; never read
    tokenizer = build_char_tokenizer(alphabet)
    build_default_model(tokenizer, seed=seed).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _fsync_tree(tmp)
    if path.exists():
        path.rmdir()  # empty (checked by the caller): rename needs the name free
    os.rename(tmp, path)
    _fsync_dir(parent)


def _fsync_tree(root: Path) -> None:
    for child in root.iterdir():
        if child.is_dir():
            _fsync_tree(child)
        else:
            with open(child, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
