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
from typing import TYPE_CHECKING

from rollvault.config.schema import GateKind, RunConfig
from rollvault.controller.loop.pipeline import RunSummary, StepCallback
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.recipes.run_parts import (
    Policy,
    PolicyStart,
    PreparedRun,
    final_model_path,
    model_run_inputs,
    policy_start,
    prompt_dataset,
    text_environment,
    token_environment,
    version_zero_policy_path,
    warmup_source,
)
from rollvault.recipes.simulated_run import prepare_simulated_run
from rollvault.tasks.registry import get_task

if TYPE_CHECKING:
    # Only a type: rollvault.training.warmup imports torch, which a simulated run never needs.
    from rollvault.training.warmup import WarmupObserver

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


def prepare(config: RunConfig, *, on_warmup: WarmupObserver | None = None) -> PreparedRun:
    """Task, dataset, model (warmed up if starting from scratch), gate and trainer for ``config``.

    ``on_warmup`` is told of the warm-up's progress, if this start warms the policy up.

    Raises :class:`~rollvault.config.schema.ConfigError` when ``dataset.kind``
    names no task or the task does not fit the gate or the warm-up. The
    result owns what it started (a trainer process): close it when the run
    ends (``with prepare(config) as prepared: ...``).
    """
    task = get_task(config.dataset.kind)
    if config.gate.kind in (GateKind.LOCAL_MODEL, GateKind.RAY, GateKind.VLLM):
        inputs = model_run_inputs(config, task)
        # Imported here, not at the top: torch and transformers cost about five
        # CPU-seconds to import, which the simulated run never needs and a
        # refused dataset or reward function should not wait for.
        from rollvault.recipes.model_run import prepare_model_run

        return prepare_model_run(config, task, inputs, on_warmup=on_warmup)
    return prepare_simulated_run(config, task)


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
    summary = await prepared.run_pipeline(
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
