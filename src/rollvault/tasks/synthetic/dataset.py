"""The synthetic task's prompts: seeded random token ids, for the simulated gate."""

from __future__ import annotations

import hashlib
import struct

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import RowDigestIdentity

__all__ = ["SYNTHETIC_TASK_NAME", "SyntheticPromptDataset", "build_synthetic_dataset"]

SYNTHETIC_TASK_NAME = "synthetic"


class SyntheticPromptDataset(RowDigestIdentity):
    """Deterministic random prompts: a function of (seed, index) only.

    Token ids come from SHAKE-256 of ``(seed, index)`` rather than a seeded
    PRNG, so they cannot change with a numpy or Python upgrade between a crash
    and its restore.
    """

    def __init__(self, num_prompts: int, prompt_tokens: int, vocab_size: int, seed: int) -> None:
        for name, value, minimum in (
            ("num_prompts", num_prompts, 1),
            ("prompt_tokens", prompt_tokens, 1),
            ("vocab_size", vocab_size, 2),
        ):
            if value < minimum:
                raise ValueError(
                    f"SyntheticPromptDataset: {name} must be >= {minimum}, got {value}"
                )
        self._num_prompts = num_prompts
        self._prompt_tokens = prompt_tokens
        self._vocab_size = vocab_size
        self._seed = seed
        # One C call for every draw of a prompt: a restore builds each group's prompt (its
        # payload and identity, row_with_identity), and int.from_bytes per token was most of it.
        self._draws = struct.Struct(f"<{prompt_tokens}I")

    def __len__(self) -> int:
        return self._num_prompts

    def __getitem__(self, idx: int) -> DatumSpec:
        self._check_index(idx)
        return {
            "idx": idx,
            "task_name": SYNTHETIC_TASK_NAME,
            "prompt_token_ids": self._tokens(idx),
            "prompt_text": f"synthetic prompt {idx}",
        }

    def _tokens(self, idx: int) -> list[int]:
        stream = hashlib.shake_256(f"rollvault/synthetic/{self._seed}/{idx}".encode())
        raw = stream.digest(4 * self._prompt_tokens)
        # 32-bit little-endian draws modulo a vocabulary of at most a few hundred thousand:
        # bias is negligible.
        vocab_size = self._vocab_size
        return [draw % vocab_size for draw in self._draws.unpack(raw)]

    def _check_index(self, idx: int) -> None:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TypeError(
                f"SyntheticPromptDataset index must be an int, got {type(idx).__name__}"
            )
        if not 0 <= idx < self._num_prompts:
            raise IndexError(
                f"SyntheticPromptDataset index {idx} out of range [0, {self._num_prompts})"
            )


def build_synthetic_dataset(
    config: DatasetConfig, *, seed: int, vocab_size: int
) -> SyntheticPromptDataset:
    """``num_prompts`` prompts of ``prompt_tokens`` token ids below ``vocab_size``."""
    return SyntheticPromptDataset(config.num_prompts, config.prompt_tokens, vocab_size, seed)
