"""Build the trainer and the gate a run config asks for.

``simulated`` + ``recording``: the deterministic simulated gate and the
recording trainer (tests, benchmarks of the controller). ``local_model`` +
``grpo``: the real recipe, a causal LM generating in a worker process and a
GRPO trainer updating it.

:func:`build_grpo_run` prepares the model directory (building the default
tiny model on the first start), loads the policy through the same code path
as any local Hugging Face model, runs the supervised warm-up when the run
starts from scratch, and returns the GRPO trainer plus a gate factory for
:func:`rollvault.controller.loop.pipeline.run`. The trainer and the generation
worker each use one torch thread: on two cores that keeps both busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rollvault.config.schema import ConfigError, RestoreMode, RunConfig, TrainerKind
from rollvault.controller.loop.pipeline import GateFactory
from rollvault.controller.loop.trainer import Trainer
from rollvault.dataplane.interface import DataPlane
from rollvault.durable.trainer_checkpoints import latest_trainer_checkpoint
from rollvault.gates.local_model import LocalModelGate
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.protocols import (
    Environment,
    PromptDataset,
    Task,
    TextEnvironment,
    WarmupSource,
)
from rollvault.tasks.registry import get_task
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.recording import RecordingTrainer
from rollvault.training.warmup import WarmupReport, supervised_warmup

__all__ = [
    "GrpoRun",
    "RunSetup",
    "build_grpo_run",
    "build_run_setup",
    "text_environment",
    "token_environment",
    "will_load_trainer_checkpoint",
]


@dataclass
class GrpoRun:
    """The trainer and gate factory of one start of a GRPO run."""

    config: RunConfig
    trainer: GrpoTrainer
    environment: TextEnvironment
    model_path: Path
    warmup: WarmupReport | None
    """None when the start resumes from a trainer checkpoint (its weights replace any warm-up)."""
    gates: list[LocalModelGate] = field(default_factory=list)
    """Every gate the factory built (one per start), for progress and benchmarks."""

    def gate_factory(self, data_plane: DataPlane) -> LocalModelGate:
        """Build the local model gate on ``data_plane`` (what ``run(gate_factory=...)`` calls)."""
        gate = LocalModelGate(
            self.config.gate.local_model,
            data_plane,
            self.environment,
            model_path=self.model_path,
            weights_provider=self.trainer.weights_for_gate,
            seed=self.config.seed,
        )
        self.gates.append(gate)
        return gate


def build_grpo_run(config: RunConfig, *, dataset: PromptDataset | None = None) -> GrpoRun:
    """Prepare the policy, warm it up if this start begins from scratch, build the trainer."""
    task = get_task(config.dataset.kind)
    environment = text_environment(config, task)
    examples = warmup_examples(config, task)
    torch.set_num_threads(1)
    model_path = ensure_model_dir(
        Path(config.model.path), build_default=config.model.build_default, seed=config.seed
    )
    model, tokenizer = load_model_dir(model_path)
    warmup = None
    steps = config.trainer.warmup.steps
    if examples is not None and not will_load_trainer_checkpoint(config):
        data = dataset or task.build_dataset(
            config.dataset, seed=config.seed, vocab_size=len(tokenizer)
        )
        warmup = supervised_warmup(
            model,
            tokenizer,
            examples(data),
            steps=steps,
            batch_size=config.trainer.warmup.batch_size,
            learning_rate=config.trainer.warmup.learning_rate,
            seed=config.seed,
        )
    settings = GrpoSettings.from_config(
        config.trainer,
        temperature=config.gate.local_model.temperature,
        success_reward=environment.success_reward,
    )
    trainer = GrpoTrainer(model, pad_token_id=int(tokenizer.pad_token_id), settings=settings)
    return GrpoRun(
        config=config,
        trainer=trainer,
        environment=environment,
        model_path=model_path,
        warmup=warmup,
    )


def text_environment(config: RunConfig, task: Task) -> TextEnvironment:
    """The environment a model gate scores ``task`` with; refused if it has none."""
    if task.text_environment is None:
        raise ConfigError(
            f"gate.kind={config.gate.kind.value} needs a task with a text environment; "
            f"dataset.kind={task.name} has none"
        )
    return task.text_environment()


def token_environment(config: RunConfig, task: Task) -> Environment:
    """The environment the simulated gate scores ``task`` with; refused if it has none."""
    if task.token_environment is None:
        raise ConfigError(
            f"gate.kind={config.gate.kind.value} needs a task with a token environment; "
            f"dataset.kind={task.name} has none"
        )
    return task.token_environment()


def warmup_examples(config: RunConfig, task: Task) -> WarmupSource | None:
    """Where the warm-up's examples come from; None without warm-up; refused if ``task`` has none."""
    if config.trainer.warmup.steps == 0:
        return None
    if task.warmup_examples is None:
        raise ConfigError(
            f"trainer.warmup.steps={config.trainer.warmup.steps} needs warm-up examples; "
            f"dataset.kind={task.name} has none (set trainer.warmup.steps=0)"
        )
    return task.warmup_examples


def will_load_trainer_checkpoint(config: RunConfig) -> bool:
    """Whether this start will resume from a trainer checkpoint (so a warm-up would be lost)."""
    if config.rollout_checkpointing.restore_mode is RestoreMode.NONE:
        return False  # a fresh start: an old run is refused or deleted, never loaded
    return latest_trainer_checkpoint(Path(config.checkpointing.checkpoint_dir)) is not None


@dataclass
class RunSetup:
    """What one start runs with."""

    trainer: Trainer
    gate_factory: GateFactory
    tokens_generated: Callable[[], int]
    """Response tokens generated so far by this start's gate(s)."""
    warmup: WarmupReport | None = None


def build_run_setup(config: RunConfig) -> RunSetup:
    """The trainer and gate factory for ``config`` (the GRPO path may warm the model up)."""
    task = get_task(config.dataset.kind)
    if config.trainer.kind is TrainerKind.GRPO:
        grpo = build_grpo_run(config)
        return RunSetup(
            trainer=grpo.trainer,
            gate_factory=grpo.gate_factory,
            tokens_generated=lambda: sum(gate.tokens_generated for gate in grpo.gates),
            warmup=grpo.warmup,
        )
    token_environment(config, task)  # refuse a task the simulated gate cannot score, now
    gates: list[SimulatedGate] = []

    def simulated_gate(data_plane: DataPlane) -> SimulatedGate:
        gate = SimulatedGate(
            config.gate.simulated, data_plane, token_environment(config, task), seed=config.seed
        )
        gates.append(gate)
        return gate

    return RunSetup(
        trainer=RecordingTrainer(),
        gate_factory=simulated_gate,
        tokens_generated=lambda: sum(gate.tokens_generated for gate in gates),
    )
