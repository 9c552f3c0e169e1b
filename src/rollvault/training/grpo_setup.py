"""Everything a real GRPO run needs besides the controller: policy, trainer, gate.

:func:`build_grpo_run` prepares the model directory (building the default
tiny model on the first start), loads the policy through the same code path
as any local Hugging Face model, runs the supervised warm-up when the run
starts from scratch, and returns the GRPO trainer plus a gate factory for
:func:`rollvault.controller.loop.pipeline.run`. The trainer and the generation
worker each use one torch thread: on two cores that keeps both busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.dataplane.interface import DataPlane
from rollvault.durable.trainer_checkpoints import latest_trainer_checkpoint
from rollvault.gates.local_model import LocalModelGate
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import PromptDataset, TextEnvironment
from rollvault.tasks.registry import build_dataset
from rollvault.tasks.warmup import warmup_examples
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.warmup import WarmupReport, supervised_warmup

__all__ = ["GrpoRun", "build_grpo_run", "will_load_trainer_checkpoint"]


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
    torch.set_num_threads(1)
    model_path = ensure_model_dir(
        Path(config.model.path), build_default=config.model.build_default, seed=config.seed
    )
    model, tokenizer = load_model_dir(model_path)
    environment = AdditionEnvironment()
    warmup = None
    steps = config.trainer.warmup.steps
    if steps > 0 and not will_load_trainer_checkpoint(config):
        data = dataset or build_dataset(config.dataset, vocab_size=len(tokenizer), seed=config.seed)
        warmup = supervised_warmup(
            model,
            tokenizer,
            warmup_examples(data),
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


def will_load_trainer_checkpoint(config: RunConfig) -> bool:
    """Whether this start will resume from a trainer checkpoint (so a warm-up would be lost)."""
    if config.rollout_checkpointing.restore_mode is RestoreMode.NONE:
        return False  # a fresh start: an old run is refused or deleted, never loaded
    return latest_trainer_checkpoint(Path(config.checkpointing.checkpoint_dir)) is not None
