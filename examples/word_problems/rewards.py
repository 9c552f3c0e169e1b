"""The worked example's reward: the last number in the response against the row's answer.

rollvault calls ``score(response_text, sample)`` once per generated response,
where ``sample`` is the row of ``problems.jsonl`` the prompt came from (a dict
with ``prompt`` and ``answer``). It returns the reward, whether the response
is correct (what the accuracy in progress, metrics and plots counts), and a
named check that ``attempts.jsonl`` records beside the reward.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")

ANSWER_REWARD = 1.0
"""For the right number."""
NUMBER_REWARD = 0.1
"""For answering with a number at all: a small push towards the format."""


def score(response_text: str, sample: dict[str, Any]) -> dict[str, float | bool]:
    """Reward 1.1 for the right last number, 0.1 for a wrong number, 0 for no number."""
    numbers = _NUMBER.findall(response_text)
    correct = bool(numbers) and int(numbers[-1]) == int(sample["answer"])
    reward = (ANSWER_REWARD if correct else 0.0) + (NUMBER_REWARD if numbers else 0.0)
    return {"reward": reward, "correct": correct, "has_number": bool(numbers)}
