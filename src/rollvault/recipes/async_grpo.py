"""The async GRPO recipe: one run of rollvault, composed top to bottom.

Read this file to know what a run is made of. :func:`prepare` builds, in order:

1. the **task** that ``dataset.kind`` names (the folder ``rollvault/tasks/<name>/``)
   and its **dataset**; a gate the task cannot be scored on is refused here,
   before anything is built;
2. with ``gate.kind=local_model``, the **model and tokenizer** of ``model.path``
   (the default tiny model is built there on the first start), warmed up on
   the task's examples when this start begins from scratch;
3. the **gate** that executes attempts and scores them with the task's
   environment: the local model gate (generation in a worker process, text
   environment) or the simulated gate (seeded tokens, token environment);
4. the **trainer**: GRPO on that model, or, for the simulated run, the
   recording trainer that checks and records its batches.

:func:`train` then hands all of it to the **pipeline**
(:func:`rollvault.controller.loop.pipeline.run`), which restores or starts
the run and runs its rollout and train pumps to the end. ``rollvault run``
is :func:`prepare`, then :func:`train`, with progress and a report around them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from rollvault.config.errors import ConfigError
from rollvault.config.schema import GateKind, RestoreMode, RunConfig
from rollvault.controller.loop.gate import Gate
from rollvault.controller.loop.pipeline import GateFactory, RunSummary, StepCallback, run
from rollvault.controller.loop.shutdown import Shutdown
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
    "PreparedRun",
    "prepare",
    "prompt_dataset",
    "text_environment",
    "token_environment",
    "train",
    "warmup_source",
    "will_load_trainer_checkpoint",
]


class _CountingGate(Gate, Protocol):
    tokens_generated: int


@dataclass
class PreparedRun:
    """What one start of the run runs with: the pipeline's inputs, and what built them."""

    config: RunConfig
    task: Task
    dataset: PromptDataset
    trainer: Trainer
    gate_factory: GateFactory
    """Builds this start's gate on the pipeline's data plane."""
    warmup: WarmupReport | None = None
    """The supervised warm-up this start ran; None when it ran none."""
    gates: list[_CountingGate] = field(default_factory=list)
    """Every gate the factory built, for progress and benchmarks."""

    def tokens_generated(self) -> int:
        """Response tokens generated so far by this start's gates."""
        return sum(gate.tokens_generated for gate in self.gates)


def prepare(config: RunConfig) -> PreparedRun:
    """Task, dataset, model (warmed up if starting from scratch), gate and trainer for ``config``.

    Raises :class:`~rollvault.config.schema.ConfigError` when ``dataset.kind``
    names no task or the task does not fit the gate or the warm-up.
    """
    task = get_task(config.dataset.kind)
    if config.gate.kind is GateKind.LOCAL_MODEL:
        return _prepare_model_run(config, task)
    return _prepare_simulated_run(config, task)


async def train(
    prepared: PreparedRun,
    *,
    on_step: StepCallback | None = None,
    shutdown: Shutdown | None = None,
) -> RunSummary:
    """Start or resume the run and run it to the end, or until ``shutdown`` is requested
    (see :func:`~rollvault.controller.loop.pipeline.run`)."""
    return await run(
        prepared.config,
        gate_factory=prepared.gate_factory,
        trainer=prepared.trainer,
        dataset=prepared.dataset,
        on_step=on_step,
        shutdown=shutdown,
    )


def _prepare_model_run(config: RunConfig, task: Task) -> PreparedRun:
    """A causal LM generating in a worker process, scored as text, trained by GRPO."""
    environment = text_environment(config, task)
    examples = warmup_source(config, task)
    dataset = prompt_dataset(config, task)
    # One torch thread here and one in the generation worker keep two cores busy.
    torch.set_num_threads(1)
    model_path = ensure_model_dir(
        Path(config.model.path), build_default=config.model.build_default, seed=config.seed
    )
    model, tokenizer = load_model_dir(model_path)
    warmup = None
    # A start that resumes a trainer checkpoint loads its weights over any warm-up.
    if examples is not None and not will_load_trainer_checkpoint(config):
        warmup = supervised_warmup(
            model,
            tokenizer,
            examples(dataset),
            steps=config.trainer.warmup.steps,
            batch_size=config.trainer.warmup.batch_size,
            learning_rate=config.trainer.warmup.learning_rate,
            seed=config.seed,
        )
    trainer = GrpoTrainer(
        model,
        pad_token_id=int(tokenizer.pad_token_id),
        settings=GrpoSettings.from_config(
            config.trainer,
            temperature=config.gate.local_model.temperature,
            success_reward=environment.success_reward,
        ),
    )
    gates: list[_CountingGate] = []

    def local_model_gate(data_plane: DataPlane) -> LocalModelGate:
        gate = LocalModelGate(
            config.gate.local_model,
            data_plane,
            environment,
            model_path=model_path,
            weights_provider=trainer.weights_for_gate,
            seed=config.seed,
        )
        gates.append(gate)
        return gate

    return PreparedRun(
        config=config,
        task=task,
        dataset=dataset,
        trainer=trainer,
        gate_factory=local_model_gate,
        warmup=warmup,
        gates=gates,
    )


def _prepare_simulated_run(config: RunConfig, task: Task) -> PreparedRun:
    """The simulated gate (seeded tokens, injectable failures) and the recording trainer."""
    token_environment(config, task)  # refuse a task it cannot score before the run starts
    gates: list[_CountingGate] = []

    def simulated_gate(data_plane: DataPlane) -> SimulatedGate:
        gate = SimulatedGate(
            config.gate.simulated, data_plane, token_environment(config, task), seed=config.seed
        )
        gates.append(gate)
        return gate

    return PreparedRun(
        config=config,
        task=task,
        dataset=prompt_dataset(config, task),
        trainer=RecordingTrainer(),
        gate_factory=simulated_gate,
        gates=gates,
    )


def prompt_dataset(config: RunConfig, task: Task) -> PromptDataset:
    """The run's dataset: what the sampler draws from and restore rehydrates prompts from.

    Token ids of a token-level task are drawn below the simulated gate's
    vocabulary: only the simulated gate scores token-level tasks (a model
    gate needs a text environment), and text tasks ignore the vocabulary.
    """
    return task.build_dataset(
        config.dataset, seed=config.seed, vocab_size=config.gate.simulated.vocab_size
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


def warmup_source(config: RunConfig, task: Task) -> WarmupSource | None:
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
