"""Composing a run: a gate the task cannot be scored on is refused before anything is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollvault.cli.main import main
from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.durable.run_lock import RUN_LOCK_FILENAME
from rollvault.gates.simulated import SimulatedGate
from rollvault.recipes.async_grpo import prepare, warmup_source
from rollvault.tasks.addition.dataset import build_addition_dataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import Task
from rollvault.tasks.registry import UnknownTaskError
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset
from rollvault.training.recording import RecordingTrainer


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return load_run_config(
        None,
        [
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            *overrides,
        ],
    )


def test_the_simulated_run_is_the_synthetic_task_on_the_simulated_gate(tmp_path: Path) -> None:
    config = _config(tmp_path, "dataset.num_prompts=12", "dataset.prompt_tokens=5")
    prepared = prepare(config)
    assert prepared.task.name == "synthetic" and prepared.warmup is None
    assert isinstance(prepared.trainer, RecordingTrainer)
    expected = SyntheticPromptDataset(12, 5, config.gate.simulated.vocab_size, config.seed)
    assert len(prepared.dataset) == 12
    assert [prepared.dataset[i] for i in range(12)] == [expected[i] for i in range(12)]
    gate = prepared.gate_factory(EmbeddedDataPlane(DataPlaneMutationCut()))
    assert isinstance(gate, SimulatedGate) and prepared.gates == [gate]
    assert prepared.tokens_generated() == 0


def test_a_model_gate_needs_a_text_environment(tmp_path: Path) -> None:
    config = _config(tmp_path, "gate.kind=local_model", "trainer.kind=grpo")
    with pytest.raises(ConfigError) as info:
        prepare(config)
    assert str(info.value) == (
        "gate.kind=local_model needs a task with a text environment; "
        "dataset.kind=synthetic has none"
    )
    assert not (tmp_path / "model").exists(), "refused after building the model"


def test_the_simulated_gate_needs_a_token_environment(tmp_path: Path) -> None:
    config = _config(tmp_path, "dataset.kind=addition")
    with pytest.raises(
        ConfigError,
        match="gate.kind=simulated needs a task with a token environment; dataset.kind=addition has none",
    ):
        prepare(config)


def test_a_warm_up_needs_warm_up_examples(tmp_path: Path) -> None:
    bare = Task(
        name="bare_addition",
        build_dataset=build_addition_dataset,
        text_environment=AdditionEnvironment,
    )
    config = _config(tmp_path, "trainer.warmup.steps=5")
    with pytest.raises(ConfigError) as info:
        warmup_source(config, bare)
    assert str(info.value) == (
        "trainer.warmup.steps=5 needs warm-up examples; dataset.kind=bare_addition has none "
        "(set trainer.warmup.steps=0)"
    )
    assert warmup_source(_config(tmp_path, "trainer.warmup.steps=0"), bare) is None


def test_an_unknown_task_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    config = _config(tmp_path, "dataset.kind=nope", "gate.kind=local_model", "trainer.kind=grpo")
    with pytest.raises(UnknownTaskError, match="dataset.kind='nope'"):
        prepare(config)
    assert not (tmp_path / "model").exists()


def test_rollvault_run_refuses_an_unknown_task_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "run",
        "dataset.kind=additon",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot start: dataset.kind='additon' names no task" in err
    assert "did you mean 'addition'?" in err
    # Refused before anything was written but the run lock, which the start takes first.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [RUN_LOCK_FILENAME]


_REFUSE_WITHOUT_TORCH = """
import sys
from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.recipes.async_grpo import prepare
config = load_run_config(None, sys.argv[1:])
try:
    prepare(config)
except ConfigError as error:
    print(error)
else:
    raise SystemExit("prepare accepted a bad dataset")
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""


def test_a_bad_dataset_file_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+2=", "answer": "3"}\n{"prompt": 7}\n')
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _REFUSE_WITHOUT_TORCH,
            "gate.kind=local_model",
            "trainer.kind=grpo",
            "dataset.kind=jsonl",
            f"dataset.path={tmp_path / 'bad.jsonl'}",
            "reward.function=exact_match",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "line 2, field 'prompt'" in result.stdout
    assert result.stdout.strip().endswith("torch not imported")
