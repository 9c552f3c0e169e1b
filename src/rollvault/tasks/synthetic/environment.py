"""The synthetic task's environment: a token-level toy verifier for the simulated gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollvault.tasks.protocols import Score

__all__ = ["ParityEnvironment"]


class ParityEnvironment:
    """Toy verifiable task for the simulated gate.

    The reward is the fraction of response tokens whose parity matches the
    parity of the prompt's first token: deterministic, cheap, and spread over
    [0, 1] so group advantages are not all zero. An empty response fails the
    format check.
    """

    def score(self, prompt: dict[str, Any], response_token_ids: Sequence[int]) -> Score:
        prompt_ids = prompt.get("prompt_token_ids") or [0]
        if not response_token_ids:
            return Score(reward=0.0, format_ok=False)
        parity = prompt_ids[0] % 2
        hits = sum(1 for token in response_token_ids if token % 2 == parity)
        return Score(reward=hits / len(response_token_ids), format_ok=True)
