"""A finished GRPO run leaves its policy as a Hugging Face model directory, ``final_model/``.

A short real run through the command line (the GRPO recipe, its worker
process and trainer), then ``from_pretrained`` on what it left: the weights
are the last trainer checkpoint's, not the start's. Extending the run
replaces the directory with the new last step's policy. The trainer runs in
the controller's process (``trainer.placement=local``): that the trainer
process exports what it trained is
``test_training_trainer_process.py``'s subject, and each start here saves
spawning a second Python.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import rollvault
from rollvault.checkpoint_tools.verify import verify_checkpoint_dir
from rollvault.cli.main import main
from rollvault.controller.snapshots.checkpointer import TRAINER_STATE_DIRNAME
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_path
from rollvault.training.trainer_files import MODEL_FILENAME

GRPO_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition.yaml"


def _run(tmp_path: Path, max_num_steps: int) -> int:
    return main(
        [
            "run",
            "--config",
            str(GRPO_RECIPE),
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            # A short warm-up: from the untrained model every reward can be 0, and then
            # GRPO's advantages, and so its updates, are all zero.
            "trainer.warmup.steps=30",
            "dataset.num_prompts=64",
            "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=4",
            f"grpo.max_num_steps={max_num_steps}",
            "rollout.max_inflight_prompts=8",
            "rollout.max_buffered_rollouts=8",
            "trainer.learning_rate=1e-2",  # a big step, so the weights surely move
            "trainer.placement=local",  # operational: see the module docstring
        ]
    )


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[name], b[name]) for name in a.keys() & b.keys())


def _check_final_model(tmp_path: Path, step: int) -> dict[str, torch.Tensor]:
    final = tmp_path / "ckpt" / "final_model"
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(final, local_files_only=True)
    assert tokenizer.decode(tokenizer("07+35=").input_ids) == "07+35="
    loaded = model.state_dict()
    trainer_dir = trainer_checkpoint_path(tmp_path / "ckpt", step) / TRAINER_STATE_DIRNAME
    checkpointed = load_file(str(trainer_dir / MODEL_FILENAME))
    assert set(loaded) == set(checkpointed)
    for name, tensor in checkpointed.items():
        assert torch.equal(loaded[name], tensor), name
    return checkpointed


@pytest.mark.slow
def test_a_finished_run_exports_its_last_policy_and_an_extension_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, max_num_steps=2) == 0
    final = tmp_path / "ckpt" / "final_model"
    assert f"final model: {final} (a Hugging Face model directory)" in capsys.readouterr().err
    # The policy the RL steps started from: version 0, saved after the warm-up.
    start = load_file(str(tmp_path / "ckpt" / "bootstrap" / "policy" / "model.safetensors"))
    at_step_2 = _check_final_model(tmp_path, step=2)
    assert _differs(at_step_2, start), "two GRPO steps left the start weights unchanged"
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(("tmp_", "trash_"))]
    assert verify_checkpoint_dir(tmp_path / "ckpt").ok  # inspect/verify take it in their stride

    assert _run(tmp_path, max_num_steps=3) == 0  # the step budget is operational: an extension
    assert "resumed at step 2" in capsys.readouterr().err
    at_step_3 = _check_final_model(tmp_path, step=3)
    assert _differs(at_step_3, at_step_2), "the extension left the final model as it was"
