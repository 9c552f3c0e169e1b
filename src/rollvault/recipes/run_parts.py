"""The pieces every kind of run is prepared into, and the decisions shared by them.

:mod:`rollvault.recipes.async_grpo` composes a run from these;
:mod:`rollvault.recipes.model_run` and :mod:`rollvault.recipes.simulated_run`
fill a :class:`PreparedRun` for each kind of gate. Nothing here imports torch
or transformers (only their types, for the checker): the simulated run, which
the chaos harness starts hundreds of times, then starts in a fraction of a
second instead of the five CPU-seconds those imports cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, Self

from rollvault.config.errors import ConfigError
from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.controller.loop.gate import Gate
from rollvault.controller.loop.pipeline import GateFactory, RunSummary, StepCallback, run
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.controller.loop.trainer import Trainer
from rollvault.controller.snapshots.resume import ResumeSource
from rollvault.durable.layout import (
    BOOTSTRAP_DIRNAME,
    BOOTSTRAP_MANIFEST_FILENAME,
    BOOTSTRAP_POLICY_DIRNAME,
    FINAL_MODEL_DIRNAME,
)
from rollvault.durable.trainer_checkpoints import latest_trainer_checkpoint
from rollvault.rewards.environment import RewardFunctionEnvironment
from rollvault.rewards.spec import BUILTIN_REWARD_FUNCTIONS
from rollvault.tasks.episodes import EpisodeSource
from rollvault.tasks.protocols import (
    PromptDataset,
    Task,
    WarmupSource,
)

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from rollvault.training.grpo_trainer import GrpoTrainer
    from rollvault.training.ray_trainer import RayTrainer
    from rollvault.training.trainer_process import ProcessTrainer
    from rollvault.training.warmup import WarmupReport

__all__ = [
    "CountingGate",
    "ModelRunInputs",
    "Policy",
    "PolicyStart",
    "PreparedRun",
    "final_model_path",
    "model_run_inputs",
    "policy_start",
    "prompt_dataset",
    "text_environment",
    "token_environment",
    "version_zero_policy_path",
    "warmup_source",
]


class CountingGate(Gate, Protocol):
    """A gate that counts the response tokens it generated (for progress and benchmarks)."""

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

    trainer: GrpoTrainer | RayTrainer | ProcessTrainer
    """In this process, in a process of its own (``trainer.placement: process``), or in a
    Ray actor (``trainer.placement: ray``)."""
    tokenizer: PreTrainedTokenizerBase
    start: PolicyStart
    """Where this start's version-0 weights came from."""


@dataclass
class PreparedRun:
    """What one start of the run runs with: the pipeline's inputs, and what built them.

    It owns what :func:`~rollvault.recipes.async_grpo.prepare` started (a
    trainer process): use it as a context manager, or call :meth:`close`, so
    that ends with the run, not at the interpreter's exit.
    """

    config: RunConfig
    task: Task
    dataset: PromptDataset
    trainer: Trainer
    gate_factory: GateFactory
    """Builds this start's gate on the pipeline's data plane."""
    warmup: WarmupReport | None = None
    """The supervised warm-up this start ran; None when it ran none."""
    gates: list[CountingGate] = field(default_factory=list)
    """Every gate the factory built, for progress and benchmarks."""
    policy: Policy | None = None
    """The policy a GRPO run trains; None for the simulated run."""
    final_model: Path | None = None
    """Where :func:`train` exported the final policy; None before that, or without a policy."""
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """What :meth:`close` stops, last first (e.g. ``ProcessTrainer.close``)."""

    def close(self) -> None:
        """Stop what preparing the run started, last first. Idempotent.

        Every callback runs even when one raises; the error is raised after.
        """
        self.resources.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def run_pipeline(
        self,
        *,
        on_step: StepCallback | None = None,
        before_start: Callable[[ResumeSource | None], None] | None = None,
        shutdown: Shutdown | None = None,
    ) -> RunSummary:
        """The pipeline's :func:`~rollvault.controller.loop.pipeline.run` on this start's inputs.

        Nothing more: :func:`~rollvault.recipes.async_grpo.train` calls it and
        also saves version 0 and exports the final policy; tests and benchmarks
        that are about the loop call it bare.
        """
        return await run(
            self.config,
            gate_factory=self.gate_factory,
            trainer=self.trainer,
            dataset=self.dataset,
            on_step=on_step,
            before_start=before_start,
            shutdown=shutdown,
        )

    def tokens_generated(self) -> int:
        """Response tokens generated so far by this start's gates."""
        return sum(gate.tokens_generated for gate in self.gates)


def final_model_path(config: RunConfig) -> Path:
    """Where a finished GRPO run leaves its policy as a Hugging Face model directory."""
    return Path(config.checkpointing.checkpoint_dir) / FINAL_MODEL_DIRNAME


def version_zero_policy_path(config: RunConfig) -> Path:
    """Where a run saves the policy it generates its first rollouts with (after the warm-up)."""
    return Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME / BOOTSTRAP_POLICY_DIRNAME


def prompt_dataset(config: RunConfig, task: Task) -> PromptDataset:
    """The run's dataset: what the sampler draws from and restore rehydrates prompts from.

    Token ids of a token-level task are drawn below the simulated gate's
    vocabulary: only the simulated gate scores token-level tasks (a model
    gate needs a text environment), and text tasks ignore the vocabulary.
    """
    return task.build_dataset(
        config.dataset, seed=config.seed, vocab_size=config.gate.simulated.vocab_size
    )


def text_environment(config: RunConfig, task: Task) -> EpisodeSource:
    """The environment a model gate scores ``task`` with; refused if there is none.

    ``reward.function``, when set, scores any task with text prompts (imported
    and checked here, before any model is built); otherwise the task's own
    text environment does. A task with no built-in scoring
    (``needs_reward_function``) needs ``reward.function``.
    """
    if config.reward.function is not None:
        return RewardFunctionEnvironment.from_config(config.reward)
    if task.episode_environment is not None:
        return task.episode_environment
    if task.text_environment is not None:
        return task.text_environment()
    if task.needs_reward_function:
        raise ConfigError(
            f"dataset.kind={task.name} has no built-in scoring; set reward.function "
            f"(a built-in: {', '.join(BUILTIN_REWARD_FUNCTIONS)}, or module:function / "
            "path.py:function)"
        )
    raise ConfigError(
        f"gate.kind={config.gate.kind.value} needs a task with a text environment; "
        f"dataset.kind={task.name} has none"
    )


def token_environment(config: RunConfig, task: Task) -> EpisodeSource:
    """The environment the simulated gate scores ``task`` with; refused if it has none."""
    if task.episode_environment is not None:
        return task.episode_environment
    if task.token_environment is None:
        raise ConfigError(
            f"gate.kind={config.gate.kind.value} needs a task with a token environment; "
            f"dataset.kind={task.name} has none"
        )
    return task.token_environment()


class ModelRunInputs(NamedTuple):
    """What a model run reads from the user's task: checked before any model is built."""

    environment: EpisodeSource
    warmup_examples: WarmupSource | None
    dataset: PromptDataset


def model_run_inputs(config: RunConfig, task: Task) -> ModelRunInputs:
    """The scoring, warm-up examples and dataset of a model run, each refused if wrong.

    A bad dataset file or reward function is refused from here, before torch
    and transformers are imported (seconds a user should not wait for "line
    2, field 'prompt'").
    """
    return ModelRunInputs(
        environment=text_environment(config, task),
        warmup_examples=warmup_source(config, task),
        dataset=prompt_dataset(config, task),
    )


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
