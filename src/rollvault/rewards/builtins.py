"""The built-in reward functions: ``exact_match``, ``numeric_match`` and ``regex_format``.

Each is called like a user's function, ``function(response_text, sample)``,
and returns a mapping with ``reward`` (1.0 or 0.0), ``correct`` and, where it
means something, ``format_ok``. The answer is ``sample["answer"]``: for a
built-in, :mod:`rollvault.rewards.environment` sets it to the task's answer
(``extra_env_info["answer"]``, whatever column of a dataset file it came
from). A sample without an answer, or an answer that is not text or a number,
raises ``ValueError``: a data failure of that attempt.

- ``exact_match``: the response, stripped of surrounding whitespace, equals
  the answer stripped.
- ``numeric_match`` (GSM8K-style): the predicted number is the one in the
  last ``\\boxed{...}`` of the response when there is one, else the last
  number in the response; the answer's number is found the same way (so a
  GSM8K solution ``... #### 72`` gives 72). They are compared exactly as
  decimals, so thousands commas, a ``$``, trailing zeros (``42.0`` is ``42``,
  ``42.50`` is ``42.5``) and a trailing period do not matter. ``format_ok``
  says a number was found in the response. No fractions, no scientific
  notation.
- ``regex_format``: ``re.fullmatch(reward.format_regex, response, re.DOTALL)``:
  the whole response must have the format (no ``^``/``$`` needed, and ``.``
  crosses lines). ``correct`` and ``format_ok`` both say it matched, so the
  run's accuracy is the fraction of responses in the format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from rollvault.rewards.spec import BUILTIN_REWARD_FUNCTIONS

__all__ = [
    "BuiltinResult",
    "builtin_reward_function",
    "exact_match",
    "extract_number",
    "numeric_match",
    "parse_number",
    "regex_format",
]

BuiltinResult = dict[str, float | bool]
"""What a built-in returns: ``reward`` and its checks."""

# A minus sign is a sign only where it does not join two terms ("5-3" is 5 and 3).
_NUMBER: Final = re.compile(
    r"(?:(?<![\w)])-)?\$?(?:\d{1,3}(?:,\d{3}(?!\d))+|\d+)(?:\.\d+)?|(?:(?<![\w)])-)?\$?\.\d+"
)
_BOXED: Final = "\\boxed{"
_GSM8K_ANSWER: Final = "####"


def exact_match(response_text: str, sample: Mapping[str, Any]) -> BuiltinResult:
    """1.0 when the stripped response equals the stripped answer, else 0.0."""
    correct = response_text.strip() == _answer_text(sample).strip()
    return {"reward": 1.0 if correct else 0.0, "correct": correct}


def numeric_match(response_text: str, sample: Mapping[str, Any]) -> BuiltinResult:
    """1.0 when the response's number equals the answer's (see the module docstring)."""
    answer_text = _answer_text(sample)
    expected = extract_number(answer_text)
    if expected is None:
        raise ValueError(f"numeric_match: the answer {answer_text!r} holds no number")
    predicted = extract_number(response_text)
    correct = predicted is not None and predicted == expected
    return {
        "reward": 1.0 if correct else 0.0,
        "correct": correct,
        "format_ok": predicted is not None,
    }


def regex_format(pattern: str) -> Callable[[str, Mapping[str, Any]], BuiltinResult]:
    """The ``regex_format`` function of ``pattern`` (``reward.format_regex``)."""
    compiled = re.compile(pattern, re.DOTALL)

    def regex_format_reward(response_text: str, sample: Mapping[str, Any]) -> BuiltinResult:
        matched = compiled.fullmatch(response_text) is not None
        return {"reward": 1.0 if matched else 0.0, "correct": matched, "format_ok": matched}

    return regex_format_reward


def builtin_reward_function(
    name: str, *, format_regex: str | None
) -> Callable[[str, Mapping[str, Any]], BuiltinResult]:
    """The built-in ``name`` (one of ``BUILTIN_REWARD_FUNCTIONS``)."""
    if name == "exact_match":
        return exact_match
    if name == "numeric_match":
        return numeric_match
    if name == "regex_format":
        if format_regex is None:
            raise ValueError("the regex_format built-in needs reward.format_regex")
        return regex_format(format_regex)
    raise ValueError(f"{name!r} is not a built-in reward function ({BUILTIN_REWARD_FUNCTIONS})")


def extract_number(text: str) -> Decimal | None:
    """The number of ``text``: in its last ``\\boxed{...}`` if any, else its last number.

    A GSM8K solution's ``#### answer`` counts as the box. None when there is
    no number there.
    """
    region = _boxed(text)
    if region is None and _GSM8K_ANSWER in text:
        region = text.rsplit(_GSM8K_ANSWER, 1)[1]
    found = _NUMBER.findall(text if region is None else region)
    return parse_number(found[-1]) if found else None


def parse_number(text: str) -> Decimal | None:
    """``text`` as a decimal, ignoring surrounding space, ``$``, commas and a trailing period."""
    cleaned = text.strip().replace(",", "").replace("$", "").removesuffix(".")
    if not cleaned or not _NUMBER.fullmatch(cleaned):
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def _boxed(text: str) -> str | None:
    """The content of the last balanced ``\\boxed{...}``, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, position = 1, start + len(_BOXED)
        for index in range(position, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[position:index]
        start = text.rfind(_BOXED, 0, start)  # unbalanced: try an earlier box
    return None


def _answer_text(sample: Mapping[str, Any]) -> str:
    if "answer" not in sample:
        raise ValueError(
            "the sample has no 'answer' for the built-in reward function to compare with "
            "(a dataset file needs dataset.answer_key)"
        )
    answer = sample["answer"]
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError(f"the sample's answer must be text or a number, got {answer!r}")
    return str(answer)
