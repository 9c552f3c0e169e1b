"""Digit strings to reverse: ``"4721="`` asks for ``"1274"``.

Prompt ``idx`` is a string of :data:`REVERSE_DIGITS` digits (leading zeros
kept) followed by ``=``; its answer, in ``extra_env_info["answer"]``, is the
same digits in reverse order. Every character is in the default character
tokenizer's alphabet. The dataset holds up to all 10,000 distinct strings, in
an order that is a pure function of the seed (SHAKE-256 keys, stably sorted),
so every process returns the same prompt for the same index.
"""

from __future__ import annotations

import hashlib

import numpy as np

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import RowDigestIdentity

__all__ = [
    "MAX_REVERSE_PROMPTS",
    "REVERSE_DIGITS",
    "REVERSE_TASK_NAME",
    "ReversePromptDataset",
    "build_reverse_dataset",
    "reverse_prompt",
]

REVERSE_TASK_NAME = "reverse"
REVERSE_DIGITS = 4
MAX_REVERSE_PROMPTS = 10**REVERSE_DIGITS
"""Distinct digit strings of that length."""


def reverse_prompt(digits: str) -> DatumSpec:
    """The prompt datum asking to reverse ``digits`` (index 0; the dataset sets the real one)."""
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"reverse_prompt: {digits!r} is not a string of ASCII digits")
    return {
        "idx": 0,
        "task_name": REVERSE_TASK_NAME,
        "prompt_text": f"{digits}=",
        "extra_env_info": {"answer": digits[::-1]},
    }


class ReversePromptDataset(RowDigestIdentity):
    """``num_prompts`` distinct digit strings in a seeded, stable order."""

    def __init__(self, num_prompts: int, *, seed: int) -> None:
        if not 1 <= num_prompts <= MAX_REVERSE_PROMPTS:
            raise ValueError(
                f"ReversePromptDataset: num_prompts must be in [1, {MAX_REVERSE_PROMPTS}] "
                f"(distinct {REVERSE_DIGITS}-digit strings), got {num_prompts}"
            )
        stream = hashlib.shake_256(f"rollvault/reverse/{seed}".encode())
        keys = np.frombuffer(stream.digest(8 * MAX_REVERSE_PROMPTS), dtype="<u8")
        order = np.argsort(keys, kind="stable")[:num_prompts]
        self._digits = [f"{int(code):0{REVERSE_DIGITS}d}" for code in order]

    def __len__(self) -> int:
        return len(self._digits)

    def __getitem__(self, idx: int) -> DatumSpec:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TypeError(f"ReversePromptDataset index must be an int, got {type(idx).__name__}")
        if not 0 <= idx < len(self._digits):
            raise IndexError(
                f"ReversePromptDataset index {idx} out of range [0, {len(self._digits)})"
            )
        datum = reverse_prompt(self._digits[idx])
        datum["idx"] = idx
        return datum


def build_reverse_dataset(
    config: DatasetConfig, *, seed: int, vocab_size: int
) -> ReversePromptDataset:
    """``num_prompts`` strings to reverse; ``vocab_size`` is unused (the gate tokenizes the text)."""
    return ReversePromptDataset(config.num_prompts, seed=seed)
