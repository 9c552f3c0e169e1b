"""Shared builders of the training and gate tests: a tiny default model, batches, configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.trainer import TrainBatch
from rollvault.dataplane.rows import Row
from rollvault.gates.sampling import sample_batch
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.synthetic_batches import response_row, step_group

torch.set_num_threads(1)


def build_model(
    directory: Path, *, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The default tiny model, built into ``directory`` and loaded back from it."""
    return load_model_dir(ensure_model_dir(directory, build_default=True, seed=seed))


def prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def sampled_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    step: int,
    prompts: list[str],
    generations: int,
    advantages_seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
) -> TrainBatch:
    """A batch of canonical-looking rows: sampled responses, random group advantages.

    Odd siblings get reward 1.0, even ones 0.0; only sibling 0 is ``correct``.
    """
    rng = np.random.default_rng(advantages_seed)
    rows: dict[str, Row] = {}
    groups = []
    for p, text in enumerate(prompts):
        ids = prompt_ids(tokenizer, text)
        sampled = sample_batch(
            model,
            [ids] * generations,
            seeds=[1000 * step + 10 * p + g for g in range(generations)],
            max_new_tokens=4,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_token_ids=[int(tokenizer.eos_token_id)],
            pad_token_id=int(tokenizer.pad_token_id),
        )
        advantages = rng.normal(size=generations)
        group = step_group(step, p)
        groups.append(group)
        for g, response in enumerate(sampled):
            rows[f"{group.group_id}_g{g}"] = {
                **response_row(
                    ids,
                    response.token_ids,
                    response.logprobs,
                    advantage=float(advantages[g]),
                    reward=float(g % 2),
                ),
                # Not the reward's pattern: accuracy must come from the verdict.
                "correct": g == 0,
            }
    return TrainBatch(step=step, groups=groups, rows=rows, generations_per_group=generations)


def grpo_config(run_dir: Path, model_dir: Path, *overrides: str) -> RunConfig:
    """A small real-training config (addition, local model gate, GRPO trainer)."""
    return load_run_config(
        None,
        [
            "gate.kind=local_model",
            "trainer.kind=grpo",
            "dataset.kind=addition",
            "gate.local_model.max_new_tokens=6",
            "reward.mask_overlong=false",
            "reward.max_response_tokens=7",
            f"model.path={model_dir}",
            f"logging.log_dir={run_dir / 'logs'}",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            "logging.progress=false",
            *overrides,
        ],
    )
