"""Two-digit addition prompts: the default verifiable task of the real training recipe.

Prompt ``idx`` is ``"AA+BB="`` (operands zero-padded to two digits) and its
answer, in ``extra_env_info["answer"]``, is the sum without leading zeros:
``"07+35="`` -> ``"42"``. The dataset holds up to all 10,000 distinct pairs,
in an order that is a pure function of the seed (SHAKE-256 keys, stably
sorted), so every process returns the same prompt for the same index. The
controller never tokenizes: the gate tokenizes ``prompt_text``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import RowDigestIdentity

__all__ = [
    "ADDITION_TASK_NAME",
    "MAX_ADDITION_PROMPTS",
    "AdditionPromptDataset",
    "addition_pair",
    "build_addition_dataset",
]

ADDITION_TASK_NAME = "addition"
MAX_ADDITION_PROMPTS = 100 * 100
"""Distinct ordered pairs of two-digit operands (00..99)."""


def addition_pair(a: int, b: int) -> DatumSpec:
    """The prompt datum of ``a + b`` (index 0; the dataset sets the real one)."""
    return {
        "idx": 0,
        "task_name": ADDITION_TASK_NAME,
        "prompt_text": f"{a:02d}+{b:02d}=",
        "extra_env_info": {"answer": str(a + b)},
    }


class AdditionPromptDataset(RowDigestIdentity):
    """``num_prompts`` distinct two-digit additions in a seeded, stable order."""

    def __init__(self, num_prompts: int, *, seed: int) -> None:
        if not 1 <= num_prompts <= MAX_ADDITION_PROMPTS:
            raise ValueError(
                f"AdditionPromptDataset: num_prompts must be in [1, {MAX_ADDITION_PROMPTS}] "
                f"(distinct two-digit pairs), got {num_prompts}"
            )
        stream = hashlib.shake_256(f"rollvault/addition/{seed}".encode())
        keys = np.frombuffer(stream.digest(8 * MAX_ADDITION_PROMPTS), dtype="<u8")
        order = np.argsort(keys, kind="stable")[:num_prompts]
        self._pairs = [(int(code) // 100, int(code) % 100) for code in order]

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, idx: int) -> DatumSpec:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TypeError(f"AdditionPromptDataset index must be an int, got {type(idx).__name__}")
        if not 0 <= idx < len(self._pairs):
            raise IndexError(
                f"AdditionPromptDataset index {idx} out of range [0, {len(self._pairs)})"
            )
        datum = addition_pair(*self._pairs[idx])
        datum["idx"] = idx
        return datum


def build_addition_dataset(
    config: DatasetConfig, *, seed: int, vocab_size: int
) -> AdditionPromptDataset:
    """``num_prompts`` additions; ``vocab_size`` is unused (the gate tokenizes the text)."""
    return AdditionPromptDataset(config.num_prompts, seed=seed)
