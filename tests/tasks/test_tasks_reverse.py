"""The reverse task, added as one folder: prompts, verifier, registry, and a real GRPO run.

The run goes through the command line (``rollvault run --config
configs/grpo_reverse.yaml``) with a short warm-up and a few steps: the local
model gate with its worker process, the reverse verifier and the GRPO trainer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

import rollvault
from rollvault.cli.main import main
from rollvault.controller.loop.run_logs import TRAIN_LOG_FILENAME, TrainLogRecord, read_jsonl
from rollvault.tasks.protocols import PromptEnvironmentError
from rollvault.tasks.registry import get_task, known_tasks
from rollvault.tasks.reverse.dataset import (
    MAX_REVERSE_PROMPTS,
    ReversePromptDataset,
    reverse_prompt,
)
from rollvault.tasks.reverse.environment import ReverseEnvironment, ReversePromptError
from rollvault.training.tokenizer import build_char_tokenizer

RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_reverse.yaml"
PROMPT = reverse_prompt("4721")


def test_prompt_shape_and_answer() -> None:
    assert PROMPT["prompt_text"] == "4721=" and PROMPT["extra_env_info"] == {"answer": "1274"}
    assert reverse_prompt("0470")["extra_env_info"] == {"answer": "0740"}  # zeros are digits
    with pytest.raises(ValueError, match="not a string of ASCII digits"):
        reverse_prompt("47a1")


def test_prompts_are_in_the_default_tokenizers_alphabet() -> None:
    tokenizer = build_char_tokenizer()
    data = ReversePromptDataset(200, seed=0)
    for i in range(len(data)):
        ids = tokenizer(data[i]["prompt_text"], add_special_tokens=False).input_ids
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == data[i]["prompt_text"]


@pytest.mark.parametrize(
    ("response", "finished", "reward", "format_ok", "correct"),
    [
        ("1274", True, 1.1, True, True),
        ("4721", True, 0.1, True, False),  # the prompt copied, not reversed
        ("1274", False, 0.0, False, False),  # cut before eos
        ("127", True, 0.0, False, False),
        ("12745", True, 0.0, False, False),
        ("12 4", True, 0.0, False, False),
        ("", True, 0.0, False, False),
    ],
)
def test_rewards(
    response: str, finished: bool, reward: float, format_ok: bool, correct: bool
) -> None:
    score = asyncio.run(ReverseEnvironment().score_text(PROMPT, response, finished=finished))
    assert score.reward == pytest.approx(reward)
    assert (score.format_ok, score.correct) == (format_ok, correct)


def test_a_prompt_without_answer_is_a_prompt_error() -> None:
    with pytest.raises(ReversePromptError, match="extra_env_info.answer") as info:
        asyncio.run(
            ReverseEnvironment().score_text({"idx": 3, "prompt_text": "12="}, "21", finished=True)
        )
    assert isinstance(info.value, PromptEnvironmentError)
    doubled = asyncio.run(
        ReverseEnvironment(answer_reward=2.0).score_text(PROMPT, "1274", finished=True)
    )
    assert doubled.reward == pytest.approx(2.1)
    with pytest.raises(ValueError, match="answer_reward"):
        ReverseEnvironment(answer_reward=0.0)


def test_dataset_is_distinct_stable_seeded_and_bounded() -> None:
    data = ReversePromptDataset(300, seed=1)
    texts = [data[i]["prompt_text"] for i in range(len(data))]
    assert len(set(texts)) == 300 and [data[i]["idx"] for i in range(3)] == [0, 1, 2]
    assert [ReversePromptDataset(300, seed=1).identity(i) for i in range(20)] == [
        data.identity(i) for i in range(20)
    ]
    assert [ReversePromptDataset(300, seed=2)[i]["prompt_text"] for i in range(20)] != texts[:20]
    for i in range(0, 300, 29):
        assert data[i]["extra_env_info"] == {"answer": texts[i][:-1][::-1]}
    with pytest.raises(ValueError, match="num_prompts"):
        ReversePromptDataset(MAX_REVERSE_PROMPTS + 1, seed=0)
    with pytest.raises(IndexError):
        data[300]
    with pytest.raises(TypeError):
        data[True]


def test_the_registry_finds_the_folder() -> None:
    task = get_task("reverse")
    assert "reverse" in known_tasks() and task.name == "reverse"
    assert task.text_environment is ReverseEnvironment and task.token_environment is None
    assert task.warmup_examples is not None
    examples = task.warmup_examples(ReversePromptDataset(3, seed=0))
    assert all(answer == prompt[:-1][::-1] for prompt, answer in examples)


def _rollvault_run(tmp_path: Path) -> int:
    return main(
        [
            "run",
            "--config",
            str(RECIPE),
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            "dataset.num_prompts=400",
            "grpo.num_prompts_per_step=8",
            "grpo.num_generations_per_prompt=4",
            "grpo.max_num_steps=10",
            "rollout.max_inflight_prompts=16",
            "rollout.max_buffered_rollouts=16",
            "trainer.warmup.steps=120",
            "checkpointing.save_period=5",
            "rollout_checkpointing.interval_s=0.5",
        ]
    )


@pytest.mark.slow
def test_a_short_grpo_run_on_the_reverse_recipe_trains_on_its_rewards(tmp_path: Path) -> None:
    assert _rollvault_run(tmp_path) == 0
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    metrics = [msgspec.json.decode(line) for line in lines]
    assert [m["step"] for m in metrics] == list(range(10))
    assert all("policy_loss" in m["trainer"] for m in metrics)  # the GRPO trainer trained
    # ... 80 distinct prompts, on rewards the reverse verifier gives: 0, 0.1 or 1.1.
    trained = read_jsonl(tmp_path / "logs" / TRAIN_LOG_FILENAME, TrainLogRecord)
    assert len({record.sample_id for record in trained}) == 80
    rewards = {round(reward, 6) for record in trained for reward in record.rewards}
    assert rewards <= {0.0, 0.1, 1.1} and 1.1 in rewards, rewards
    # After the warm-up the policy reverses a good share of the strings it samples.
    accuracy = [m["trainer"]["accuracy"] for m in metrics]
    assert sum(accuracy) / len(accuracy) > 0.2, accuracy
