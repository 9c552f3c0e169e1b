"""The reward function environment: samples, results, failures, async and slow functions."""

from __future__ import annotations

import asyncio
import math
import textwrap
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollvault.config.schema import RewardConfig
from rollvault.rewards.environment import RewardFunctionEnvironment, reward_sample
from rollvault.rewards.errors import (
    RewardFunctionRaisedError,
    RewardFunctionResultError,
    RewardFunctionScoreError,
    RewardFunctionTimeoutError,
)
from rollvault.rewards.loading import LoadedRewardFunction
from rollvault.rewards.spec import parse_reward_function
from rollvault.tasks.addition.dataset import addition_pair
from rollvault.tasks.protocols import PromptEnvironmentError, TextEnvironment, TextScore

ROW_PROMPT: dict[str, Any] = {
    "idx": 7,
    "task_name": "jsonl",
    "prompt_text": "What is 6*7?",
    "extra_env_info": {
        "answer": "42",
        "row": {"question": "What is 6*7?", "solution": "42", "tags": ["math"]},
    },
}
ADDITION_PROMPT = {**addition_pair(7, 35), "idx": 3}


def _environment(
    function: Any, *, is_async: bool = False, timeout_s: float | None = None
) -> RewardFunctionEnvironment:
    spec = parse_reward_function("user_rewards:score")
    return RewardFunctionEnvironment(
        LoadedRewardFunction(spec=spec, function=function, is_async=is_async),
        timeout_s=timeout_s,
    )


def _score(environment: TextEnvironment, prompt: Mapping[str, Any], text: str) -> TextScore:
    return asyncio.run(environment.score_text(prompt, text, finished=True))


def test_the_sample_is_the_dataset_row_when_the_prompt_carries_one() -> None:
    seen: list[dict[str, Any]] = []

    def score(response_text: str, sample: dict[str, Any]) -> float:
        seen.append(sample)
        sample["tags"].append("changed")  # must not reach the prompt
        return 0.25

    result = _score(_environment(score), ROW_PROMPT, "42")
    assert result == TextScore(reward=0.25, format_ok=True, correct=None, checks={})
    assert seen == [{"question": "What is 6*7?", "solution": "42", "tags": ["math", "changed"]}]
    assert ROW_PROMPT["extra_env_info"]["row"]["tags"] == ["math"]


def test_the_sample_of_a_builtin_task_is_its_prompt_and_extra_env_info() -> None:
    assert reward_sample(ADDITION_PROMPT) == {"prompt": "07+35=", "answer": "42"}
    messages = [{"role": "user", "content": "hi"}]
    chat = {"idx": 0, "messages": messages, "extra_env_info": {"answer": "x", "level": 2}}
    assert reward_sample(chat) == {"prompt": messages, "answer": "x", "level": 2}
    assert reward_sample({"idx": 0, "prompt_text": "p"}) == {"prompt": "p"}


def test_a_builtin_compares_with_the_tasks_answer_whatever_its_column() -> None:
    # The row's own column is "solution"; extra_env_info["answer"] is the task's answer.
    assert reward_sample(ROW_PROMPT, task_answer=True)["answer"] == "42"
    assert "answer" not in reward_sample(ROW_PROMPT)
    environment = RewardFunctionEnvironment.from_config(RewardConfig(function="numeric_match"))
    assert _score(environment, ROW_PROMPT, "It is 42.").correct is True
    assert _score(environment, ADDITION_PROMPT, "41").correct is False


def test_a_mapping_result_gives_correct_format_and_named_checks() -> None:
    def score(response_text: str, sample: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "reward": 1,
            "correct": np.bool_(True),
            "format_ok": False,
            "length_ok": True,
            "similarity": np.float32(0.5),
        }

    result = _score(_environment(score), ROW_PROMPT, "42")
    assert result == TextScore(
        reward=1.0,
        format_ok=False,
        correct=True,
        checks={"length_ok": True, "similarity": 0.5},
    )
    assert type(result.reward) is float and type(result.correct) is bool


def test_a_mapping_without_correct_is_left_out_of_accuracy() -> None:
    result = _score(_environment(lambda r, s: {"reward": 0.1}), ROW_PROMPT, "x")
    assert (result.reward, result.correct, result.format_ok) == (0.1, None, True)
    assert (
        _score(_environment(lambda r, s: {"reward": 0.0, "correct": None}), ROW_PROMPT, "x").correct
        is None
    )


def test_an_async_function_is_awaited_on_the_event_loop() -> None:
    threads: list[threading.Thread] = []

    async def score(response_text: str, sample: Mapping[str, Any]) -> dict[str, Any]:
        threads.append(threading.current_thread())
        await asyncio.sleep(0)
        return {"reward": float(len(response_text)), "correct": True}

    result = _score(_environment(score, is_async=True), ROW_PROMPT, "abc")
    assert (result.reward, result.correct) == (3.0, True)
    assert threads == [threading.main_thread()]


def test_a_function_returning_an_awaitable_is_awaited() -> None:
    async def later() -> float:
        return 0.75

    assert _score(_environment(lambda r, s: later()), ROW_PROMPT, "x").reward == 0.75


def test_a_slow_sync_function_runs_in_a_thread_and_never_blocks_the_loop() -> None:
    threads: list[threading.Thread] = []
    started, release = threading.Event(), threading.Event()

    def slow(response_text: str, sample: Mapping[str, Any]) -> float:
        threads.append(threading.current_thread())
        started.set()
        # Returns only once the loop has run on while it was scoring; on the loop's own
        # thread it would wait out the timeout (which only bounds that failure).
        return 1.0 if release.wait(timeout=10.0) else 0.0

    async def main() -> float:
        scoring = asyncio.create_task(_environment(slow).score_text(ROW_PROMPT, "x", finished=True))
        assert await asyncio.to_thread(started.wait, 10.0), "the function was not called"
        assert not scoring.done()
        release.set()  # the loop runs while the function waits
        return (await scoring).reward

    reward = asyncio.run(main())
    assert threads[0] is not threading.main_thread()
    assert reward == 1.0, "the event loop was blocked while the reward ran"


def test_a_function_that_raises_fails_the_attempt_naming_exception_and_row() -> None:
    def score(response_text: str, sample: Mapping[str, Any]) -> float:
        raise KeyError("solution_v2")

    with pytest.raises(RewardFunctionRaisedError) as info:
        _score(_environment(score), ROW_PROMPT, "42")
    assert str(info.value) == (
        "reward.function='user_rewards:score' raised KeyError: 'solution_v2' (dataset row idx=7)"
    )
    assert isinstance(info.value, PromptEnvironmentError)  # the gate: a data failure
    assert isinstance(info.value.__cause__, KeyError)


def test_an_async_function_past_its_timeout_fails_the_attempt_naming_the_limit() -> None:
    async def hangs(response_text: str, sample: Mapping[str, Any]) -> float:
        await asyncio.Event().wait()
        return 1.0

    with pytest.raises(RewardFunctionTimeoutError) as info:
        _score(_environment(hangs, is_async=True, timeout_s=0.05), ROW_PROMPT, "42")
    assert str(info.value) == (
        "reward.function='user_rewards:score' did not return within reward.timeout_s=0.05 s "
        "(dataset row idx=7)"
    )
    assert isinstance(info.value, PromptEnvironmentError)  # the gate: a data failure


def test_a_hung_sync_function_releases_its_attempt_at_the_timeout() -> None:
    release = threading.Event()

    def hangs(response_text: str, sample: Mapping[str, Any]) -> float:
        release.wait(timeout=30)
        return 1.0

    async def main() -> None:
        try:
            with pytest.raises(RewardFunctionTimeoutError, match=r"timeout_s=0.05 s"):
                await _environment(hangs, timeout_s=0.05).score_text(
                    ROW_PROMPT, "42", finished=True
                )
        finally:
            # The thread Python cannot stop ends here, before asyncio.run waits for it.
            release.set()

    asyncio.run(main())


def test_a_timeout_error_the_function_raises_itself_is_its_own_failure() -> None:
    def score(response_text: str, sample: Mapping[str, Any]) -> float:
        raise TimeoutError("the grader's sandbox timed out")

    with pytest.raises(RewardFunctionRaisedError, match="raised TimeoutError: the grader's"):
        _score(_environment(score, timeout_s=30.0), ROW_PROMPT, "42")


def test_the_timeout_comes_from_the_config() -> None:
    assert RewardConfig().timeout_s == 300.0
    environment = RewardFunctionEnvironment.from_config(
        RewardConfig(function="exact_match", timeout_s=2.5)
    )
    assert environment.timeout_s == 2.5


def test_an_async_function_that_raises_fails_the_attempt() -> None:
    async def score(response_text: str, sample: Mapping[str, Any]) -> float:
        raise ValueError("bad row")

    with pytest.raises(
        RewardFunctionRaisedError, match=r"raised ValueError: bad row \(dataset row idx=3\)"
    ):
        _score(_environment(score, is_async=True), ADDITION_PROMPT, "42")


def test_a_builtin_without_an_answer_fails_the_attempt() -> None:
    environment = RewardFunctionEnvironment.from_config(RewardConfig(function="exact_match"))
    with pytest.raises(
        RewardFunctionRaisedError, match=r"raised ValueError: the sample has no 'answer'.*idx=5"
    ):
        _score(environment, {"idx": 5, "prompt_text": "p"}, "42")


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (math.nan, r"returned nan: a reward must be finite"),
        (math.inf, r"returned inf: a reward must be finite"),
        ({"reward": -math.inf}, r"returned a 'reward' of -inf: a reward must be finite"),
        (True, r"returned True of type bool; a reward is a number"),
        ("1.0", r"returned '1.0' of type str; a reward is a number"),
        (None, r"returned None of type NoneType"),
        ([1.0], r"returned \[1.0\] of type list"),
        ({"correct": True}, r"returned a mapping without 'reward' \(keys: \['correct'\]\)"),
        ({"reward": "high"}, r"returned a 'reward' of 'high' of type str"),
        ({"reward": 1.0, "correct": 1}, r"'correct' must be a bool, got 1 of type int"),
        ({"reward": 1.0, "format_ok": "yes"}, r"'format_ok' must be a bool"),
        ({"reward": 1.0, "note": "long"}, r"check 'note' must be a bool or a finite number"),
        ({"reward": 1.0, "ratio": math.nan}, r"check 'ratio' must be a bool or a finite number"),
        ({"reward": 1.0, 3: True}, r"a mapping with a non-string key 3"),
    ],
)
def test_a_wrong_result_fails_the_attempt(result: object, message: str) -> None:
    with pytest.raises(RewardFunctionResultError, match=message) as info:
        _score(_environment(lambda r, s: result), ROW_PROMPT, "42")
    assert str(info.value).startswith("reward.function='user_rewards:score' (dataset row idx=7)")
    assert isinstance(info.value, RewardFunctionScoreError)


def test_ints_and_numpy_numbers_are_rewards() -> None:
    for value, expected in ((2, 2.0), (np.float64(0.5), 0.5), (np.int64(-1), -1.0)):
        reward = _score(_environment(lambda r, s, v=value: v), ROW_PROMPT, "x").reward
        assert reward == expected and type(reward) is float


def test_a_file_function_scores_end_to_end(tmp_path: Path) -> None:
    path = tmp_path / "rewards.py"
    path.write_text(
        textwrap.dedent(
            """
            def score(response_text, sample):
                right = response_text.strip() == sample["answer"]
                return {"reward": 1.0 if right else 0.0, "correct": right, "chars": len(response_text)}
            """
        )
    )
    environment = RewardFunctionEnvironment.from_config(RewardConfig(function=f"{path}:score"))
    assert environment.loaded.spec.target == str(path)
    assert _score(environment, ADDITION_PROMPT, "42") == TextScore(
        reward=1.0, format_ok=True, correct=True, checks={"chars": 2.0}
    )
    assert _score(environment, ADDITION_PROMPT, "4").correct is False
