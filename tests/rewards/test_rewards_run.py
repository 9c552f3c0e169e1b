"""A real GRPO run scored by a user's reward file that raises on some rows.

``rollvault run`` on the local model gate, the GRPO trainer and the default
tiny model, on the addition task, with ``reward.function`` naming a file
written here. The function raises on every prompt whose sum is a multiple of
5: each of its attempts fails as a data failure named in ``attempts.jsonl``
(the exception and the dataset row), the group is given up after its retry
budget and replaced, and the run finishes. Every other prompt trains on the
function's own rewards, its ``correct`` drives the accuracy, and its named
check is logged with each sealed attempt.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgspec
import pytest

from rollvault.checkpoint_tools.run_history import read_run_history
from rollvault.cli.main import main
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.addition.dataset import AdditionPromptDataset

pytestmark = pytest.mark.slow

REWARDS = """
def score(response_text, sample):
    answer = int(sample["answer"])
    if answer % 5 == 0:
        raise ZeroDivisionError(f"cannot score {sample['prompt']}")
    right = response_text == sample["answer"]
    digits = response_text.isdigit()
    return {
        "reward": 1.0 if right else (0.25 if digits else 0.0),
        "correct": right,
        "digits": digits,
    }
"""
NUM_PROMPTS = 48
STEPS = 5


def test_a_reward_function_that_raises_fails_its_attempts_and_the_run_finishes(
    tmp_path: Path,
) -> None:
    rewards = tmp_path / "user" / "rewards.py"
    rewards.parent.mkdir()
    rewards.write_text(textwrap.dedent(REWARDS))
    logs = tmp_path / "logs"
    code = main(
        [
            "run",
            "gate.kind=local_model",
            "trainer.kind=grpo",
            "dataset.kind=addition",
            f"dataset.num_prompts={NUM_PROMPTS}",
            f"reward.function={rewards}:score",
            "reward.mask_overlong=false",
            "reward.max_response_tokens=7",
            "gate.local_model.max_new_tokens=6",
            "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=4",
            f"grpo.max_num_steps={STEPS}",
            "grpo.max_num_epochs=1",
            "rollout.max_inflight_prompts=8",
            "rollout.max_buffered_rollouts=8",
            "rollout.max_group_retries=1",
            "rollout.on_dropped_prompt=replace",
            "sampler.shuffle=false",
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={logs}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "logging.progress=false",
            "logging.tensorboard=false",
        ]
    )
    assert code == 0
    dataset = AdditionPromptDataset(NUM_PROMPTS, seed=0)
    poison = {
        idx for idx in range(NUM_PROMPTS) if int(dataset[idx]["extra_env_info"]["answer"]) % 5 == 0
    }
    history = read_run_history(logs)
    assert sorted(history.steps) == list(range(STEPS))

    # Each failed attempt names the exception and the dataset row, and only poison rows fail.
    failed = [a for a in history.attempts if a.status is RolloutAttemptStatus.FAILED]
    assert failed, "no poison prompt was dispatched"
    failed_rows = set()
    for attempt in failed:
        assert attempt.reason is not None and attempt.reason.startswith(
            f"reward.function='{rewards}:score' raised ZeroDivisionError: cannot score "
        )
        idx = int(attempt.reason.rsplit("dataset row idx=", 1)[1].rstrip(")"))
        assert idx in poison and dataset[idx]["prompt_text"] in attempt.reason
        failed_rows.add(idx)
    # Every poison prompt dispatched was given up after its budget, and never trained.
    dropped = {int(drop.sample_id) for drop in history.drops}
    assert dropped == failed_rows
    assert all(drop.replaced for drop in history.drops)
    trained_rows = {int(record.sample_id) for record in history.train}
    assert len(trained_rows) == 4 * STEPS and not trained_rows & poison

    # Rewards come from the user's function; its verdict and named check are logged ...
    assert {reward for record in history.train for reward in record.rewards} <= {0.0, 0.25, 1.0}
    sealed = [a for a in history.attempts if a.status is RolloutAttemptStatus.SEALED]
    for attempt in sealed:
        assert attempt.checks is not None and set(attempt.checks) == {
            "format_ok",
            "correct",
            "digits",
        }
        expected = 1.0 if attempt.checks["correct"] else (0.25 if attempt.checks["digits"] else 0.0)
        assert attempt.reward == expected
    # ... and its correct is the accuracy of every step.
    metrics = [
        msgspec.json.decode(line) for line in (logs / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(metrics) == STEPS and all("accuracy" in m["trainer"] for m in metrics)
