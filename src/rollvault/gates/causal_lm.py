"""Loading a local Hugging Face causal LM directory: one code path for every model.

The default tiny model and a user's model load through the same two calls,
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``,
both with ``local_files_only=True``: nothing is ever downloaded at run time.
The generation worker and the trainer both load through here, so they see
the same architecture, dtype and attention implementation.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelDType
from rollvault.gates.errors import ModelDirError

__all__ = [
    "ModelDirError",
    "cache_argument_name",
    "load_causal_lm",
    "torch_dtype",
    "load_tokenizer",
    "quiet_transformers",
]


def quiet_transformers() -> None:
    """No progress bars or info chatter from transformers on the run's terminal."""
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


_TORCH_DTYPES = {ModelDType.FLOAT32: torch.float32, ModelDType.BFLOAT16: torch.bfloat16}


def torch_dtype(dtype: ModelDType) -> torch.dtype:
    """The torch dtype of a ``model.dtype`` setting."""
    return _TORCH_DTYPES[dtype]


def load_causal_lm(path: Path, *, dtype: ModelDType = ModelDType.FLOAT32) -> PreTrainedModel:
    """The causal LM saved in ``path``, in ``dtype`` (whatever it was saved in), in eval
    mode (no dropout)."""
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{path} is not a model directory (no config.json)")
    quiet_transformers()
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=torch_dtype(dtype)
    )
    model.eval()
    return model


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved with the model in ``path``; it must define pad and eos tokens."""
    quiet_transformers()
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path, local_files_only=True)
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name) is None:
            raise ModelDirError(f"the tokenizer in {path} defines no {name.removesuffix('_id')}")
    return tokenizer


def cache_argument_name(model: PreTrainedModel) -> str:
    """The forward keyword that takes the KV cache (``cache`` in transformers 5,
    ``past_key_values`` in older versions and in some remote architectures)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
