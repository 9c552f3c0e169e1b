"""Warm-up examples of the guessing game: well-formed guesses, uniformly random.

Each example is a game prefix (the prompt, earlier guesses each ended by
``<eos>``, and their feedback) and a random next digit. It teaches the
format (one digit, then the end of the response) and nothing about the
strategy: that using the feedback pays is left to RL.
"""

from __future__ import annotations

import random

from rollvault.tasks.guess.dataset import GUESS_PROMPT_TEXT
from rollvault.tasks.guess.environment import DEFAULT_MAX_TURNS, HIGHER, LOWER
from rollvault.tasks.protocols import PromptDataset

__all__ = ["guess_warmup_examples"]

_END = "<eos>"
"""The default tokenizer's end-of-sequence token, as text (it parses it as the token)."""


def guess_warmup_examples(dataset: PromptDataset) -> list[tuple[str, str]]:
    """2,000 seeded ``(game prefix, random digit)`` pairs (the dataset is not needed)."""
    del dataset
    rng = random.Random(0)
    examples = []
    for _ in range(2000):
        prefix = GUESS_PROMPT_TEXT
        for _turn in range(rng.randrange(DEFAULT_MAX_TURNS)):
            prefix += f"{rng.randrange(10)}{_END}{rng.choice((HIGHER, LOWER))}"
        examples.append((prefix, str(rng.randrange(10))))
    return examples
