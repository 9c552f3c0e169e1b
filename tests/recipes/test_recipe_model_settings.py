"""A model run composed with the settings users expect: dtype, sampling, chat template, alphabet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.gate import AttemptRequest
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.gates.errors import ModelDirError
from rollvault.gates.local_model import LocalModelGate
from rollvault.recipes.async_grpo import prepare
from rollvault.training.grpo_trainer import GrpoTrainer
from rollvault.training.logprobs import sequence_logprobs
from rollvault.training.model_store import build_default_model
from rollvault.training.tokenizer import build_char_tokenizer


def _config(tmp_path: Path, *extra: str) -> RunConfig:
    return load_run_config(
        None,
        [
            "gate.kind=local_model",
            "trainer.kind=grpo",
            "dataset.kind=addition",
            "dataset.num_prompts=16",
            f"model.path={tmp_path / 'model'}",
            f"logging.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "logging.progress=false",
            *extra,
        ],
    )


def test_chat_template_on_a_model_without_one_is_refused_at_start(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    build_default_model(tokenizer, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    with pytest.raises(ModelDirError, match=r"model\.path") as info:
        prepare(_config(tmp_path, "model.chat_template=true"))
    assert str(tmp_path / "model") in str(info.value)
    assert "no chat template" in str(info.value)


def test_the_default_model_is_built_with_the_configured_alphabet(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    prepared = prepare(_config(tmp_path, 'model.default_alphabet="0123456789+= ab"'))
    request.addfinalizer(prepared.close)
    assert prepared.policy is not None
    tokenizer = prepared.policy.tokenizer
    assert tokenizer.decode(tokenizer("1 + 2 = ab").input_ids) == "1 + 2 = ab"
    assert isinstance(prepared.policy.trainer, GrpoTrainer)  # trainer.placement=local
    assert prepared.policy.trainer.model.config.vocab_size == 3 + 15


@pytest.mark.slow
def test_a_bfloat16_run_has_bfloat16_trainer_and_worker_models(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    config = _config(
        tmp_path,
        "model.dtype=bfloat16",
        "gate.local_model.top_p=0.9",
        "gate.local_model.top_k=5",
        "trainer.micro_batch_size=2",
    )
    prepared = prepare(config)
    request.addfinalizer(prepared.close)
    trainer = prepared.trainer
    assert isinstance(trainer, GrpoTrainer) and trainer.model.dtype == torch.bfloat16
    assert prepared.policy is not None
    tokenizer = prepared.policy.tokenizer

    async def main() -> list[tuple[list[int], int, np.ndarray]]:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        gate = prepared.gate_factory(data_plane)
        assert isinstance(gate, LocalModelGate)
        try:
            outcomes = await asyncio.gather(
                *(
                    gate.run_attempt(
                        AttemptRequest(
                            group_id=f"g{i}",
                            generation_index=0,
                            gate_rollout_id=f"g{i}_g0_a{i}",
                            prompt=dict(prepared.dataset[i]),
                            weight_version=0,
                        )
                    )
                    for i in range(8)
                )
            )
            assert gate.worker_dtype == "torch.bfloat16"
            keys = [o.receipt["staging_keys"][0] for o in outcomes]
            rows = await data_plane.get(STAGING_PARTITION, keys)
        finally:
            await gate.close()
        return [
            (
                np.asarray(rows[k]["input_ids"]).tolist(),
                int(rows[k]["prompt_length"]),
                np.asarray(rows[k]["generation_logprobs"]),
            )
            for k in keys
        ]

    staged = asyncio.run(main())
    recomputed = sequence_logprobs(
        trainer.model,
        [ids for ids, _, _ in staged],
        temperature=1.0,
        top_p=0.9,
        top_k=5,
        pad_token_id=int(tokenizer.pad_token_id),
    )
    gaps = np.concatenate(
        [
            np.abs(again[n:] - generated[n:])
            for (_, n, generated), again in zip(staged, recomputed, strict=True)
        ]
    )
    # bfloat16 rounding, and nucleus-boundary flips it causes (see test_training_logprobs).
    assert float(gaps.mean()) <= 2e-2, gaps
