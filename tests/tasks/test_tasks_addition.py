"""The addition task: prompts, answers, and the verifier's rewards."""

from __future__ import annotations

import asyncio

import pytest

from rollvault.config.schema import DatasetConfig
from rollvault.tasks.addition.dataset import (
    MAX_ADDITION_PROMPTS,
    AdditionPromptDataset,
    addition_pair,
)
from rollvault.tasks.addition.environment import AdditionEnvironment, AdditionPromptError
from rollvault.tasks.protocols import PromptEnvironmentError
from rollvault.tasks.registry import build_dataset

PROMPT = addition_pair(7, 35)


def test_prompt_shape_and_answer() -> None:
    assert PROMPT["prompt_text"] == "07+35="
    assert PROMPT["extra_env_info"] == {"answer": "42"}
    assert addition_pair(99, 99)["extra_env_info"] == {"answer": "198"}
    assert addition_pair(0, 0)["prompt_text"] == "00+00="


@pytest.mark.parametrize(
    ("response", "finished", "reward", "format_ok", "correct"),
    [
        ("42", True, 1.1, True, True),
        ("41", True, 0.1, True, False),
        ("042", True, 0.1, True, False),  # exact answer means no leading zero
        ("42", False, 0.0, False, False),  # cut before eos: not the model's answer
        ("4 2", True, 0.0, False, False),
        ("42<pad>", True, 0.0, False, False),
        ("", True, 0.0, False, False),
        ("1234", True, 0.0, False, False),
    ],
)
def test_rewards(
    response: str, finished: bool, reward: float, format_ok: bool, correct: bool
) -> None:
    score = asyncio.run(AdditionEnvironment().score_text(PROMPT, response, finished=finished))
    assert score.reward == pytest.approx(reward)
    assert (score.format_ok, score.correct) == (format_ok, correct)


def test_the_answer_reward_and_format_reward_set_the_scale() -> None:
    environment = AdditionEnvironment(answer_reward=2.0, format_reward=0.5)
    right = asyncio.run(environment.score_text(PROMPT, "42", finished=True))
    wrong = asyncio.run(environment.score_text(PROMPT, "41", finished=True))
    assert (right.reward, wrong.reward) == (pytest.approx(2.5), pytest.approx(0.5))
    with pytest.raises(ValueError):
        AdditionEnvironment(answer_reward=0.0)


def test_a_prompt_without_answer_is_a_prompt_error() -> None:
    with pytest.raises(AdditionPromptError, match="extra_env_info.answer") as info:
        asyncio.run(
            AdditionEnvironment().score_text({"idx": 3, "prompt_text": "1+1="}, "2", finished=True)
        )
    assert isinstance(info.value, PromptEnvironmentError)


def test_dataset_is_distinct_stable_and_seeded() -> None:
    data = AdditionPromptDataset(500, seed=1)
    texts = [data[i]["prompt_text"] for i in range(len(data))]
    assert len(set(texts)) == 500
    assert [data[i]["idx"] for i in range(3)] == [0, 1, 2]
    again = AdditionPromptDataset(500, seed=1)
    assert [again.identity(i) for i in range(20)] == [data.identity(i) for i in range(20)]
    other = AdditionPromptDataset(500, seed=2)
    assert [other[i]["prompt_text"] for i in range(20)] != texts[:20]
    for i in range(0, 500, 37):
        a, b = (int(x) for x in data[i]["prompt_text"][:-1].split("+"))
        assert data[i]["extra_env_info"] == {"answer": str(a + b)}
    full = AdditionPromptDataset(MAX_ADDITION_PROMPTS, seed=0)
    assert len({full[i]["prompt_text"] for i in range(len(full))}) == MAX_ADDITION_PROMPTS


def test_dataset_bounds_and_registration() -> None:
    with pytest.raises(ValueError, match="num_prompts"):
        AdditionPromptDataset(MAX_ADDITION_PROMPTS + 1, seed=0)
    data = AdditionPromptDataset(5, seed=0)
    with pytest.raises(IndexError):
        data[5]
    with pytest.raises(TypeError):
        data[True]
    built = build_dataset(DatasetConfig(kind="addition", num_prompts=5), vocab_size=2, seed=0)
    assert isinstance(built, AdditionPromptDataset) and len(built) == 5
