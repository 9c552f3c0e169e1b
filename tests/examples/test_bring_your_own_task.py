"""Bring your own task, end to end: a JSONL file and a reward module of the user's, run
by real ``rollvault run`` processes on the local model gate and the default tiny model.

The chaos harness kills the run twice and lets the third start finish; then
every row must have been trained exactly once per epoch, and every trained
reward must be what the user's function gave that row. The worked example
under ``examples/word_problems/`` runs for a few steps as the README shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from zygote_slot import ROLLVAULT_CLI, ZygoteSlot

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.checkpoint_tools.run_history import read_run_history

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "word_problems"
ROWS = 24
EPOCHS = 2
GENERATIONS = 4
RIGHT_ANSWER_BONUS = 0.5

REWARDS_PY = f"""
def score(response_text, sample):
    # Each row carries its own base reward, so a trained reward names its row.
    base = float(sample["base"])
    correct = response_text.strip() == sample["answer"]
    return {{"reward": base + ({RIGHT_ANSWER_BONUS} if correct else 0.0), "correct": correct}}
"""


def _base(index: int) -> float:
    return round(0.01 * (index + 1), 2)


def _write_task(directory: Path) -> tuple[Path, Path]:
    rows = directory / "rows.jsonl"
    with rows.open("w") as out:
        for index in range(ROWS):
            a, b = 3 * index % 50, 7 * index % 40
            row = {"prompt": f"{a}+{b}=", "answer": str(a + b), "base": _base(index)}
            out.write(json.dumps(row) + "\n")
    rewards = directory / "my_rewards.py"
    rewards.write_text(REWARDS_PY)
    return rows, rewards


def _config(directory: Path, rows: Path, rewards: Path) -> Path:
    config = directory / "own_task.yaml"
    config.write_text(
        f"""
dataset: {{kind: jsonl, path: {rows}}}
reward: {{function: "{rewards}:score", mask_overlong: false, max_response_tokens: 5}}
grpo: {{num_prompts_per_step: 4, num_generations_per_prompt: {GENERATIONS},
        max_num_steps: 1000, max_num_epochs: {EPOCHS}}}
rollout: {{max_inflight_prompts: 8, max_buffered_rollouts: 12}}
gate: {{kind: local_model, local_model: {{max_new_tokens: 4}}}}
model: {{path: model, build_default: true}}
trainer: {{kind: grpo}}
checkpointing: {{save_period: 3}}
rollout_checkpointing: {{interval_s: 0.5}}
"""
    )
    return config


@pytest.mark.slow
def test_own_rows_and_reward_train_every_row_once_per_epoch_through_kills(
    tmp_path: Path,
) -> None:
    rows, rewards = _write_task(tmp_path)
    plan = ChaosPlan(
        run_dir=tmp_path / "run",
        kills=2,
        seed=3,
        config_path=_config(tmp_path, rows, rewards),
        # By train steps, not seconds (a timer had to be retuned per machine: a quiet one
        # finished a start before its kill). The run trains 12 steps (2 epochs of 24
        # rows, 4 per step); seed 3 draws 1 and 3, so both kills land mid-training.
        kill_window_s=None,
        kill_after_steps=(1, 3),
    )
    report = run_chaos(plan)
    assert report.problems == [], report.problems
    assert report.kills_delivered == 2
    history = read_run_history(tmp_path / "run" / "logs")
    trained = [record for records in history.steps.values() for record in records]
    # Every row, every epoch, exactly once (the harness checked the same from the ledger's side).
    assert sorted((r.epoch, int(r.sample_id)) for r in trained) == sorted(
        (epoch, index) for epoch in range(EPOCHS) for index in range(ROWS)
    )
    # Every reward is the user's function on that row: its base, plus the bonus if right.
    for record in trained:
        base = _base(int(record.sample_id))
        assert len(record.rewards) == GENERATIONS
        for reward in record.rewards:
            assert reward - base == pytest.approx(0.0) or reward - base == pytest.approx(
                RIGHT_ANSWER_BONUS
            ), (record.sample_id, reward)


@pytest.mark.slow
def test_the_worked_example_runs_as_the_readme_shows(tmp_path: Path) -> None:
    # The README's command, from the repository root, with its outputs moved to tmp_path.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollvault.cli.main",
            "run",
            "--config",
            str(EXAMPLE / "recipe.yaml"),
            "grpo.max_num_steps=3",
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            "logging.progress=false",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    history = read_run_history(tmp_path / "logs")
    assert sorted(history.steps) == [0, 1, 2]
    problems = [json.loads(line) for line in (EXAMPLE / "problems.jsonl").read_text().splitlines()]
    for records in history.steps.values():
        for record in records:
            assert int(record.sample_id) < len(problems)
            # rewards.py gives 0, 0.1 (a number) or 1.1 (the right number).
            assert all(r in (0.0, 0.1, 1.1) for r in record.rewards), record.rewards
    assert (tmp_path / "checkpoints" / "final_model" / "config.json").is_file()


# Commands fork from one process that has imported the command line once.
CLI = ZygoteSlot(ROLLVAULT_CLI, timeout_s=300)
_cli_zygote = CLI.module_fixture()


def _refused_start(cwd: Path, *overrides: str) -> str:
    result = CLI.run(["run", *overrides, "logging.progress=false"], os.environ, cwd=cwd)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.slow
def test_bad_files_and_reward_functions_refuse_the_start_naming_what_and_where(
    tmp_path: Path,
) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+2=", "answer": "3"}\n{"prompt": 7}\n')
    (tmp_path / "good.jsonl").write_text('{"prompt": "1+2=", "answer": "3"}\n')
    (tmp_path / "one_arg.py").write_text("def score(text):\n    return 1.0\n")
    model_run = ["gate.kind=local_model", "trainer.kind=grpo", "dataset.kind=jsonl"]
    stderr = _refused_start(
        tmp_path, *model_run, "dataset.path=bad.jsonl", "reward.function=exact_match"
    )
    assert "bad.jsonl, line 2, field 'prompt'" in stderr
    stderr = _refused_start(
        tmp_path, *model_run, "dataset.path=good.jsonl", "reward.function=one_arg.py:score"
    )
    assert "reward.function='one_arg.py:score'" in stderr and "(response_text, sample)" in stderr
    stderr = _refused_start(
        tmp_path, *model_run, "dataset.path=good.jsonl", "reward.function=missing.py:score"
    )
    assert "missing.py does not exist" in stderr
    # Nothing was written for any of them but the run lock.
    assert [p.name for p in (tmp_path / "runs" / "default" / "checkpoints").iterdir()] == [".lock"]
