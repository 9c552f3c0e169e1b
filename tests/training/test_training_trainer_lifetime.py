"""The trainer process lives as long as the run that started it, not as long as the interpreter.

``prepare`` starts it (``trainer.placement: process``) and the
:class:`~rollvault.recipes.run_parts.PreparedRun` owns it: ``rollvault run``
closes the run when it returns, under its run lock.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from grpo_test_helpers import grpo_config

from rollvault.cli.run_command import run_command
from rollvault.recipes import model_run
from rollvault.recipes.run_parts import PreparedRun
from rollvault.training.trainer_process import ProcessTrainer

pytestmark = pytest.mark.slow  # a GRPO run on the tiny model, its trainer in a process


def _gone(pid: int) -> bool:
    """No process has ``pid`` (the child was reaped, not left a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_trainer_process_is_gone_when_rollvault_run_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[ProcessTrainer] = []

    class RecordedProcessTrainer(ProcessTrainer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    monkeypatch.setattr(model_run, "ProcessTrainer", RecordedProcessTrainer)
    config = grpo_config(
        tmp_path,
        tmp_path / "model",
        "trainer.placement=process",
        "trainer.warmup.steps=0",
        "dataset.num_prompts=8",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "grpo.max_num_steps=2",
    )
    assert run_command(config) == 0
    (trainer,) = started
    assert not trainer.is_alive()
    assert _gone(trainer.pid)


def test_closing_a_prepared_run_runs_its_closers_last_first_once() -> None:
    closed: list[str] = []

    def failing() -> None:
        closed.append("failing")
        raise OSError("pipe")

    prepared = PreparedRun(
        config=None,  # type: ignore[arg-type]
        task=None,  # type: ignore[arg-type]
        dataset=None,  # type: ignore[arg-type]
        trainer=None,  # type: ignore[arg-type]
        gate_factory=None,  # type: ignore[arg-type]
    )
    for closer in (lambda: closed.append("first"), failing, lambda: closed.append("last")):
        prepared.resources.callback(closer)
    with pytest.raises(OSError, match="pipe"), prepared:
        pass
    assert closed == ["last", "failing", "first"]
    prepared.close()  # nothing left to close
    assert closed == ["last", "failing", "first"]
