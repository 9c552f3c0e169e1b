"""Guess-the-number prompts: a hidden digit per prompt, the same visible prompt for all.

Prompt ``idx`` hides ``secret = digit(idx)`` (a seeded, stable order over
0..9) in ``extra_env_info["secret"]``; its ``prompt_text`` is ``"*"``: the
model learns the number only from the environment's feedback. The prompt
text uses only characters of the default model's alphabet.
"""

from __future__ import annotations

import hashlib

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import RowDigestIdentity

__all__ = ["GUESS_PROMPT_TEXT", "GUESS_TASK_NAME", "GuessPromptDataset", "build_guess_dataset"]

GUESS_TASK_NAME = "guess"
GUESS_PROMPT_TEXT = "*"
NUM_SECRETS = 10
"""Secrets are the digits 0..9."""


class GuessPromptDataset(RowDigestIdentity):
    """``num_prompts`` games, each with a hidden digit drawn from the seed."""

    def __init__(self, num_prompts: int, *, seed: int) -> None:
        if num_prompts < 1:
            raise ValueError(f"GuessPromptDataset: num_prompts must be >= 1, got {num_prompts}")
        stream = hashlib.shake_256(f"rollvault/guess/{seed}".encode()).digest(num_prompts)
        self._secrets = [byte % NUM_SECRETS for byte in stream]

    def __len__(self) -> int:
        return len(self._secrets)

    def __getitem__(self, idx: int) -> DatumSpec:
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TypeError(f"GuessPromptDataset index must be an int, got {type(idx).__name__}")
        if not 0 <= idx < len(self._secrets):
            raise IndexError(f"GuessPromptDataset index {idx} out of range [0, {len(self)})")
        return {
            "idx": idx,
            "task_name": GUESS_TASK_NAME,
            "prompt_text": GUESS_PROMPT_TEXT,
            "extra_env_info": {"secret": self._secrets[idx]},
        }


def build_guess_dataset(config: DatasetConfig, *, seed: int, vocab_size: int) -> GuessPromptDataset:
    """``num_prompts`` games; ``vocab_size`` is unused (observations are text)."""
    return GuessPromptDataset(config.num_prompts, seed=seed)
