"""The built-in reward functions: exact_match, numeric_match (GSM8K-style), regex_format."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollvault.rewards.builtins import (
    builtin_reward_function,
    exact_match,
    extract_number,
    numeric_match,
    parse_number,
    regex_format,
)


@pytest.mark.parametrize(
    ("response", "answer", "correct"),
    [
        ("42", "42", True),
        ("  42\n", "42", True),
        ("42", " 42 ", True),
        ("042", "42", False),
        ("Paris", "paris", False),  # exact: case matters
        ("", "", True),
        ("4 2", "42", False),
    ],
)
def test_exact_match(response: str, answer: str, correct: bool) -> None:
    assert exact_match(response, {"answer": answer}) == {
        "reward": 1.0 if correct else 0.0,
        "correct": correct,
    }


def test_exact_match_takes_a_numeric_answer_as_text() -> None:
    assert exact_match("7", {"answer": 7})["correct"] is True


@pytest.mark.parametrize(
    ("response", "answer", "correct", "format_ok"),
    [
        ("The answer is 42.", "42", True, True),
        ("42", "42", True, True),
        ("It costs $1,234.50 in total", "1234.5", True, True),
        ("42.0", "42", True, True),
        ("42.50", "42.5", True, True),
        ("$18", "18", True, True),
        ("first 3 then 5", "5", True, True),  # the last number
        ("first 3 then 5", "3", False, True),
        ("\\boxed{7} but then I said 9", "7", True, True),  # the box wins
        ("\\boxed{1} and later \\boxed{2}", "2", True, True),  # the last box
        ("\\boxed{\\text{about } 12}", "12", True, True),
        ("\\boxed{\\frac{1}{2}}", "0.5", False, True),  # no fractions: its last number is 2
        ("\\boxed{none}", "3", False, False),  # a box without a number: no answer
        ("x = -3", "-3", True, True),
        ("5-3=2", "2", True, True),  # a minus between terms is no sign
        ("#### 72", "72", True, True),
        ("no number here", "4", False, False),
        ("", "4", False, False),
        ("12", "12.0001", False, True),
        (".5 of it", "0.5", True, True),
        ("2,000,000", "2000000", True, True),
        ("answer: 100%", "100", True, True),
    ],
)
def test_numeric_match(response: str, answer: str, correct: bool, format_ok: bool) -> None:
    assert numeric_match(response, {"answer": answer}) == {
        "reward": 1.0 if correct else 0.0,
        "correct": correct,
        "format_ok": format_ok,
    }


def test_numeric_match_reads_a_gsm8k_solution_answer_and_numbers() -> None:
    solution = "She has 3 + 4 = <<3+4=7>>7 apples, times 2 is 14.\n#### 14"
    assert numeric_match("so 14", {"answer": solution})["correct"] is True
    assert numeric_match("so 7", {"answer": solution})["correct"] is False
    assert numeric_match("so 14", {"answer": 14})["correct"] is True
    assert numeric_match("so 0.25", {"answer": 0.25})["correct"] is True


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({}, "the sample has no 'answer'"),
        ({"answer": None}, "the sample's answer must be text or a number, got None"),
        ({"answer": True}, "must be text or a number, got True"),
        ({"answer": "many"}, "numeric_match: the answer 'many' holds no number"),
    ],
)
def test_numeric_match_without_a_usable_answer_raises(sample: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        numeric_match("42", sample)


def test_exact_match_without_an_answer_raises() -> None:
    with pytest.raises(ValueError, match="no 'answer'"):
        exact_match("42", {"prompt": "p"})


def test_parse_number() -> None:
    assert parse_number(" $1,000. ") == Decimal(1000)
    assert parse_number("-0.50") == Decimal("-0.5")
    assert parse_number("1e5") is None
    assert parse_number("12abc") is None
    assert parse_number("") is None
    assert extract_number("\\boxed{3") == 3  # an unbalanced box is no box


@st.composite
def _formatted(draw: st.DrawFn) -> tuple[Decimal, str]:
    """A number and one of the ways a model writes it."""
    whole = draw(st.integers(min_value=0, max_value=10**9))
    cents = draw(st.none() | st.integers(min_value=0, max_value=99))
    negative = draw(st.booleans()) and (whole or cents)
    value = Decimal(whole) + (Decimal(cents) / 100 if cents is not None else 0)
    text = f"{whole:,}" if draw(st.booleans()) else str(whole)
    if cents is not None:
        text += f".{cents:02d}"
    elif draw(st.booleans()):
        text += "." + "0" * draw(st.integers(min_value=1, max_value=3))  # 42.0, 42.000
    if draw(st.booleans()):
        text = "$" + text
    if negative:
        text, value = "-" + text, -value
    prefix = draw(st.sampled_from(["", "The answer is ", "so x = ", "step 1 gives 3. Then "]))
    suffix = draw(st.sampled_from(["", ".", " ", " dollars.", "!"]))
    if draw(st.booleans()):
        return value, f"{prefix}\\boxed{{{text}}}{suffix}"
    return value, f"{prefix}{text}{suffix}"


@given(_formatted())
def test_every_way_of_writing_the_answer_matches(case: tuple[Decimal, str]) -> None:
    value, response = case
    assert numeric_match(response, {"answer": str(value)})["correct"] is True
    assert numeric_match(response, {"answer": f"{value:,}"})["correct"] is True


@given(_formatted(), st.integers(min_value=1, max_value=1000))
def test_a_different_number_never_matches(case: tuple[Decimal, str], offset: int) -> None:
    value, response = case
    result = numeric_match(response, {"answer": str(value + Decimal(offset) / 100)})
    assert result == {"reward": 0.0, "correct": False, "format_ok": True}


def test_regex_format_matches_the_whole_response_across_lines() -> None:
    score = regex_format(r"<think>.*</think><answer>\d+</answer>")
    assert score("<think>a\nb</think><answer>12</answer>", {}) == {
        "reward": 1.0,
        "correct": True,
        "format_ok": True,
    }
    # fullmatch: a matching part is not enough.
    assert score("junk <think>a</think><answer>12</answer>", {})["reward"] == 0.0
    assert score("<think>a</think><answer>12</answer> junk", {})["correct"] is False
    assert score("", {})["format_ok"] is False


def test_builtin_reward_function_by_name() -> None:
    assert builtin_reward_function("exact_match", format_regex=None) is exact_match
    assert builtin_reward_function("numeric_match", format_regex=None) is numeric_match
    assert builtin_reward_function("regex_format", format_regex="a+")("aaa", {})["correct"]
    with pytest.raises(ValueError, match="needs reward.format_regex"):
        builtin_reward_function("regex_format", format_regex=None)
    with pytest.raises(ValueError, match="not a built-in"):
        builtin_reward_function("fuzzy", format_regex=None)
