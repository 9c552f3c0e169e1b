"""A run on a causal LM: generation in a worker process or on vLLM servers, text scoring, GRPO.

The one part of a run that needs torch and transformers; the composition
(:func:`rollvault.recipes.async_grpo.prepare`) imports it only for
``gate.kind=local_model`` and ``gate.kind=vllm``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import (
    GateKind,
    PrefixResume,
    RunConfig,
    SamplingConfig,
    TrainerPlacement,
)
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.local_model import LocalModelGate
from rollvault.gates.prompt_rendering import PromptFormat, PromptRenderer
from rollvault.gates.vllm.gate import VllmGate
from rollvault.recipes.run_parts import (
    CountingGate,
    ModelRunInputs,
    Policy,
    PolicyStart,
    PreparedRun,
    policy_start,
    version_zero_policy_path,
)
from rollvault.tasks.protocols import Task
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.policy_dirs import DamagedPolicyError, load_policy
from rollvault.training.trainer_process import ProcessTrainer
from rollvault.training.warmup import WarmupObserver, supervised_warmup

if TYPE_CHECKING:
    from rollvault.training.ray_trainer import RayTrainer

__all__ = ["prepare_model_run"]


def prepare_model_run(
    config: RunConfig,
    task: Task,
    inputs: ModelRunInputs,
    *,
    on_warmup: WarmupObserver | None = None,
) -> PreparedRun:
    """A causal LM generating in a worker process, scored as text, trained by GRPO.

    ``inputs`` are :func:`~rollvault.recipes.run_parts.model_run_inputs`' for
    ``config`` and ``task``, already checked. ``on_warmup`` is told of the
    warm-up's progress, if this start warms the policy up.
    """
    environment, examples, dataset = inputs
    # One torch thread here and one in the generation worker keep two cores busy.
    torch.set_num_threads(1)
    model_path = ensure_model_dir(
        Path(config.model.path),
        build_default=config.model.build_default,
        seed=config.seed,
        alphabet=config.model.default_alphabet,
    )
    start = policy_start(config)
    model, tokenizer = _version_zero_model(config, model_path, start)
    prompt_format = PromptFormat.from_config(config.model)
    # Refuses a tokenizer without a chat template under model.chat_template now,
    # before any warm-up; the gate renders prompts with the same settings.
    renderer = PromptRenderer(tokenizer, prompt_format, model_path=model_path)
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
            renderer=renderer,
            on_progress=on_warmup,
        )
    # The trainer recomputes logprobs under the distribution the gate samples from.
    vllm = config.gate.kind is GateKind.VLLM
    sampling: SamplingConfig = config.gate.vllm if vllm else config.gate.local_model
    local_trainer = GrpoTrainer(
        model,
        pad_token_id=int(tokenizer.pad_token_id),
        settings=GrpoSettings.from_config(
            config.trainer,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
        ),
    )
    trainer: GrpoTrainer | RayTrainer | ProcessTrainer = local_trainer
    resources = contextlib.ExitStack()
    if config.trainer.placement is TrainerPlacement.RAY:
        trainer = _trainer_actor(config, local_trainer, model_path, int(tokenizer.pad_token_id))
    elif config.trainer.placement is TrainerPlacement.PROCESS:
        trainer = ProcessTrainer(
            local_trainer,
            model_path=model_path,
            dtype=config.model.dtype,
            pad_token_id=int(tokenizer.pad_token_id),
            settings=local_trainer.settings,
        )
        resources.callback(trainer.close)  # the process ends with the run (PreparedRun.close)
    gates: list[CountingGate] = []

    chunk_tokens = (
        None
        if config.rollout.prefix_resume is PrefixResume.OFF
        else config.rollout.prefix_resume_tokens
    )

    def vllm_gate(data_plane: DataPlane) -> VllmGate:
        gate = VllmGate(
            config.gate.vllm,
            data_plane,
            environment,
            model_path=model_path,
            weights_provider=trainer.weights_for_gate,
            seed=config.seed,
            prompt_format=prompt_format,
        )
        gates.append(gate)
        return gate

    def local_model_gate(data_plane: DataPlane) -> LocalModelGate:
        if config.gate.kind is GateKind.RAY:
            return ray_pool_gate(data_plane)
        gate = LocalModelGate(
            config.gate.local_model,
            data_plane,
            environment,
            model_path=model_path,
            weights_provider=trainer.weights_for_gate,
            seed=config.seed,
            prompt_format=prompt_format,
            dtype=config.model.dtype,
            chunk_tokens=chunk_tokens,
        )
        gates.append(gate)
        return gate

    def ray_pool_gate(data_plane: DataPlane) -> LocalModelGate:
        # Imported only for the Ray gate: it imports ray.
        from rollvault.gates.ray_pool import RayPoolGate

        gate = RayPoolGate(
            config.gate.local_model,
            data_plane,
            environment,
            pool=config.gate.ray,
            model_path=model_path,
            weights_provider=trainer.weights_for_gate,
            seed=config.seed,
            prompt_format=prompt_format,
            dtype=config.model.dtype,
            chunk_tokens=chunk_tokens,
        )
        gates.append(gate)
        return gate

    return PreparedRun(
        config=config,
        task=task,
        dataset=dataset,
        trainer=trainer,
        gate_factory=vllm_gate if vllm else local_model_gate,
        warmup=warmup,
        gates=gates,
        policy=Policy(trainer=trainer, tokenizer=tokenizer, start=start),
        resources=resources,
    )


def _trainer_actor(
    config: RunConfig, trainer: GrpoTrainer, model_path: Path, pad_token_id: int
) -> RayTrainer:
    """The trainer moved into a Ray actor, starting from ``trainer``'s current weights."""
    # Imported only for trainer.placement=ray: it imports ray.
    from rollvault.training.ray_trainer import RayTrainer

    return RayTrainer(
        trainer,
        model_path=model_path,
        dtype=config.model.dtype,
        pad_token_id=pad_token_id,
        settings=trainer.settings,
        num_cpus=config.trainer.ray_num_cpus,
        num_gpus=config.trainer.ray_num_gpus,
    )


def _version_zero_model(
    config: RunConfig, model_path: Path, start: PolicyStart
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The saved version-0 policy for ``SAVED`` (its files checked first), else ``model.path``."""
    if start is not PolicyStart.SAVED:
        return load_model_dir(model_path, dtype=config.model.dtype)
    path = version_zero_policy_path(config)
    try:
        return load_policy(path, dtype=config.model.dtype)
    except DamagedPolicyError as error:
        raise DamagedPolicyError(
            f"{error} (this is the version-0 policy saved after the run's warm-up; "
            f"delete {path} to warm up again)"
        ) from error
