"""The async GRPO recipe: one run of rollvault, composed top to bottom.

Read this file to know what a run is made of. :func:`prepare` builds, in order:

1. the **task** that ``dataset.kind`` names (the folder ``rollvault/tasks/<name>/``)
   and its **dataset**; a gate the task cannot be scored on is refused here,
   before anything is built;
2. with ``gate.kind=local_model``, the **model and tokenizer**: those of
   ``model.path`` (the default tiny model is built there on the first start),
   warmed up on the task's examples when this start begins from scratch; or,
   for a restart before the first trainer checkpoint, the **version-0
   policy** the first start saved after its warm-up (:func:`policy_start`
   decides which);
3. the **gate** that executes attempts and scores them with the task's
   environment: the local model gate (generation in a worker process, text
   environment) or the simulated gate (seeded tokens, token environment);
4. the **trainer**: GRPO on that model, or, for the simulated run, the
   recording trainer that checks and records its batches.

:func:`train` then hands all of it to the **pipeline**
(:func:`rollvault.controller.loop.pipeline.run`), which restores or starts
the run and runs its rollout and train pumps to the end. A start that
warmed up saves that policy as version 0 in
``<checkpointing.checkpoint_dir>/bootstrap/policy/`` once the pipeline has
checked the checkpoint directory and before anything is generated, so the
bootstrap rollouts can always be traced to the weights that generated them
and a restart need not warm up again. When the run
finishes (its step budget trained, or its data used up), a GRPO run exports
its policy as a Hugging Face model directory,
``<checkpointing.checkpoint_dir>/final_model/``, replacing the one an earlier
start left. ``rollvault run`` is :func:`prepare`, then :func:`train`, with
progress and a report around them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.errors import ConfigError
from rollvault.config.schema import GateKind, RestoreMode, RunConfig
from rollvault.controller.loop.gate import Gate
from rollvault.controller.loop.pipeline import GateFactory, RunSummary, StepCallback, run
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.controller.loop.trainer import Trainer
from rollvault.dataplane.interface import DataPlane
from rollvault.durable.layout import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    BOOTSTRAP_POLICY_DIRNAME,
    FINAL_MODEL_DIRNAME,
)
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
from rollvault.training.policy_dirs import DamagedPolicyError, load_policy
from rollvault.training.recording import RecordingTrainer
from rollvault.training.warmup import WarmupReport, supervised_warmup

__all__ = [
    "Policy",
    "PolicyStart",
    "PreparedRun",
    "final_model_path",
    "policy_start",
    "prepare",
    "prompt_dataset",
    "text_environment",
    "token_environment",
    "train",
    "version_zero_policy_path",
    "warmup_source",
]


class _CountingGate(Gate, Protocol):
    tokens_generated: int


class PolicyStart(StrEnum):
    """Where one start of a GRPO run takes its version-0 policy from."""

    MODEL = "model"
    """``model.path`` as it is: the run has no warm-up."""
    WARM_UP = "warm_up"
    """``model.path``, warmed up by this start and then saved as the version-0 policy."""
    SAVED = "saved"
    """The version-0 policy an earlier start of the run saved after its warm-up."""
    TRAINER_CHECKPOINT = "trainer_checkpoint"
    """``model.path``: the pipeline loads the newest trainer checkpoint's weights over it."""


@dataclass(frozen=True)
class Policy:
    """A GRPO run's policy: the model ``trainer`` trains in place, and its tokenizer."""

    trainer: GrpoTrainer
    tokenizer: PreTrainedTokenizerBase
    start: PolicyStart
    """Where this start's version-0 weights came from."""


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
    policy: Policy | None = None
    """The policy a GRPO run trains; None for the simulated run."""
    final_model: Path | None = None
    """Where :func:`train` exported the final policy; None before that, or without a policy."""

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
    (see :func:`~rollvault.controller.loop.pipeline.run`).

    Once it has finished, a run with a policy exports it to
    :func:`final_model_path` and records the path in ``prepared.final_model``.
    A run that raises (killed, refused) or was stopped by ``shutdown`` exports
    nothing: its policy is not final.
    """
    summary = await run(
        prepared.config,
        gate_factory=prepared.gate_factory,
        trainer=prepared.trainer,
        dataset=prepared.dataset,
        on_step=on_step,
        # policy_start already read the directory this resume was found in.
        before_start=lambda _resume: _save_version_zero(prepared),
        shutdown=shutdown,
    )
    policy = prepared.policy
    stopped = shutdown is not None and shutdown.requested
    if policy is not None and not stopped:
        prepared.final_model = await asyncio.to_thread(
            policy.trainer.export_policy, final_model_path(prepared.config), policy.tokenizer
        )
    return summary


def _save_version_zero(prepared: PreparedRun) -> None:
    """Save the policy this start warmed up as version 0, with digests of its files.

    Called by the pipeline once it has checked the checkpoint directory
    (a changed config is refused first, ``force_fresh`` has cleared an old
    run) and before the gate generates anything with these weights. Only a
    start that warmed up saves: every other start found one saved, has no
    warm-up, or resumes a trainer checkpoint.
    """
    policy = prepared.policy
    if policy is None or policy.start is not PolicyStart.WARM_UP:
        return
    path = version_zero_policy_path(prepared.config)
    policy.trainer.export_policy(path, policy.tokenizer, with_digests=True)


def final_model_path(config: RunConfig) -> Path:
    """Where a finished GRPO run leaves its policy as a Hugging Face model directory."""
    return Path(config.checkpointing.checkpoint_dir) / FINAL_MODEL_DIRNAME


def version_zero_policy_path(config: RunConfig) -> Path:
    """Where a run saves the policy it generates its first rollouts with (after the warm-up)."""
    return Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME / BOOTSTRAP_POLICY_DIRNAME


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
    start = policy_start(config)
    model, tokenizer = _version_zero_model(config, model_path, start)
    warmup = None
    # examples is None exactly when the run has no warm-up steps (then start is not WARM_UP).
    if start is PolicyStart.WARM_UP and examples is not None:
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
        policy=Policy(trainer=trainer, tokenizer=tokenizer, start=start),
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


def policy_start(config: RunConfig) -> PolicyStart:
    """Where this start's version-0 policy comes from; decided before any model is loaded.

    A start that resumes a trainer checkpoint loads its weights over any
    warm-up, so it runs none. A start that resumes a run before its first
    trainer checkpoint loads the version-0 policy the run saved, when there
    is one: its bootstrap rollouts were generated with those very weights,
    and the warm-up is not paid for twice. Any other start warms up when the
    run has a warm-up; ``restore_mode=none`` always starts fresh (an old run
    is refused or deleted, never loaded).
    """
    if config.rollout_checkpointing.restore_mode is not RestoreMode.NONE:
        checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
        if latest_trainer_checkpoint(checkpoint_dir) is not None:
            return PolicyStart.TRAINER_CHECKPOINT
        holds_run = (checkpoint_dir / BOOTSTRAP_DIRNAME / BOOTSTRAP_MANIFEST_FILENAME).is_file()
        if holds_run and version_zero_policy_path(config).is_dir():
            return PolicyStart.SAVED
    return PolicyStart.WARM_UP if config.trainer.warmup.steps > 0 else PolicyStart.MODEL


def _version_zero_model(
    config: RunConfig, model_path: Path, start: PolicyStart
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The saved version-0 policy for ``SAVED`` (its files checked first), else ``model.path``."""
    if start is not PolicyStart.SAVED:
        return load_model_dir(model_path)
    path = version_zero_policy_path(config)
    try:
        return load_policy(path)
    except DamagedPolicyError as error:
        raise DamagedPolicyError(
            f"{error} (this is the version-0 policy saved after the run's warm-up; "
            f"delete {path} to warm up again)"
        ) from error
