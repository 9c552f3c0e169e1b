"""The vLLM gate against a real vLLM server: rows, logprob agreement, seeds, weight sync, faults.

Every test here talks to the session's one server (see ``conftest.py``). The
fault test (a SIGKILLed server, restarted and refitted) is a whole run:
``test_vllm_run.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import VllmGateConfig
from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    staged_row_digest,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.gates.vllm.client import VllmClient
from rollvault.gates.vllm.fleet import Server
from rollvault.gates.vllm.gate import VllmGate
from rollvault.gates.vllm.health import ServerHealth
from rollvault.gates.vllm.launch import ManagedServer
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.training.logprobs import sequence_logprobs
from rollvault.training.model_store import load_model_dir

pytestmark = pytest.mark.slow

DATA = AdditionPromptDataset(64, seed=0)
TEMPERATURE = 0.7
LOGPROB_ATOL = 2e-4
"""float32 on both sides; vLLM's CPU kernels sum in another order than torch's."""


class _Weights:
    """A weights provider over a model the test trains, like the trainer's weights_for_gate."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    def __call__(self) -> bytes:
        state = self.model.state_dict()
        return save({k: v.detach().clone().contiguous() for k, v in state.items()})


def _request(index: int, attempt: str = "a", group: str | None = None) -> AttemptRequest:
    return AttemptRequest(
        group_id=group or f"g{index}",
        generation_index=0,
        gate_rollout_id=f"g{index}_g0_{attempt}{index}",
        prompt=dict(DATA[index]),
        weight_version=0,
    )


def _gate(
    server: ManagedServer,
    model_dir: Path,
    weights: _Weights,
    data_plane: EmbeddedDataPlane,
    tmp_path: Path,
    *,
    managed: bool = False,
) -> VllmGate:
    config = VllmGateConfig(
        temperature=TEMPERATURE,
        max_new_tokens=6,
        launch=managed,
        urls=[] if managed else [server.url],
        weights_dir=str(tmp_path / "vllm"),
        request_timeout_s=30.0,
        startup_timeout_s=240.0,
    )
    client = VllmClient(server.url, model=str(model_dir), timeout_s=30.0)
    return VllmGate(
        config,
        data_plane,
        AdditionEnvironment(),
        model_path=model_dir,
        weights_provider=weights,
        seed=0,
        servers=[Server(client=client, managed=server if managed else None)],
    )


async def _check_rows(
    outcomes: Sequence[AttemptOutcome],
    data_plane: EmbeddedDataPlane,
    model: PreTrainedModel,
    pad_token_id: int,
) -> float:
    """Check every staged row against its receipt; return the largest logprob difference."""
    keys = [o.receipt["staging_keys"][0] for o in outcomes]
    rows = await data_plane.get(STAGING_PARTITION, keys)
    sequences, prompt_lengths = [], []
    for outcome, key in zip(outcomes, keys, strict=True):
        row = rows[key]
        assert staged_row_digest(row) == outcome.receipt["row_digests"][0]["digest"]
        assert outcome.receipt["weight_version"] == outcome.weight_version
        length = int(row["prompt_length"])
        mask = np.asarray(row["token_mask"])
        assert int(mask.sum()) == outcome.num_tokens and not mask[:length].any()
        assert (
            len(np.asarray(row["input_ids"]))
            == len(np.asarray(row["generation_logprobs"]))
            == len(mask)
        )
        sequences.append(np.asarray(row["input_ids"]).tolist())
        prompt_lengths.append(length)
    recomputed = sequence_logprobs(
        model, sequences, temperature=TEMPERATURE, pad_token_id=pad_token_id
    )
    worst = 0.0
    for key, length, again in zip(keys, prompt_lengths, recomputed, strict=True):
        generated = np.asarray(rows[key]["generation_logprobs"])
        np.testing.assert_allclose(again[length:], generated[length:], atol=LOGPROB_ATOL)
        worst = max(worst, float(np.abs(again[length:] - generated[length:]).max()))
    return worst


def _train_step(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """One optimizer step that changes what the model says (a stand-in for a GRPO step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.tensor([tokenizer.encode("11+11=22")])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_rows_receipts_and_logprobs_match_the_trainer(
    vllm_server: ManagedServer, vllm_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_model_dir(vllm_model_dir)
    weights = _Weights(model)

    async def main() -> None:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        gate = _gate(vllm_server, vllm_model_dir, weights, data_plane, tmp_path)
        try:
            outcomes = await asyncio.gather(*(gate.run_attempt(_request(i)) for i in range(16)))
            assert {o.weight_version for o in outcomes} == {0}
            assert gate.tokens_generated == sum(o.num_tokens for o in outcomes) > 0
            worst = await _check_rows(outcomes, data_plane, model, int(tokenizer.pad_token_id))
            print(f"largest |vLLM - trainer| logprob difference: {worst:.2e}")
            # Seeded by the rollout id: the same attempt id samples the same tokens.
            key = outcomes[3].receipt["staging_keys"][0]
            before = (await data_plane.get(STAGING_PARTITION, [key]))[key]["input_ids"]
            await gate.run_attempt(_request(3))
            after = (await data_plane.get(STAGING_PARTITION, [key]))[key]["input_ids"]
            assert np.array_equal(before, after)
            assert await gate.fleet.servers[0].client.weight_version() == "0"
        finally:
            await gate.close()

    asyncio.run(main())


def test_weight_sync_changes_outputs_and_weight_info_after_a_trainer_step(
    vllm_server: ManagedServer, vllm_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_model_dir(vllm_model_dir)
    weights = _Weights(model)
    pad = int(tokenizer.pad_token_id)

    async def main() -> None:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        gate = _gate(vllm_server, vllm_model_dir, weights, data_plane, tmp_path)
        client = gate.fleet.servers[0].client
        try:
            requests = [_request(i, "v0") for i in range(8)]
            before = await asyncio.gather(*(gate.run_attempt(r) for r in requests))
            before_rows = await data_plane.get(
                STAGING_PARTITION, [o.receipt["staging_keys"][0] for o in before]
            )
            before_ids = {k: np.asarray(r["input_ids"]).copy() for k, r in before_rows.items()}
            _train_step(model, tokenizer)
            # Attempts in flight when the update starts finish under version 0 and say so.
            inflight = [asyncio.create_task(gate.run_attempt(_request(i, "x"))) for i in range(8)]
            await asyncio.sleep(0)
            await gate.update_weights(1)
            assert {o.weight_version for o in await asyncio.gather(*inflight)} == {0}
            assert await client.weight_version() == "1"
            assert gate.fleet.health.state(client.url) is ServerHealth.HEALTHY
            await data_plane.clear(STAGING_PARTITION, list(before_ids))
            after = await asyncio.gather(*(gate.run_attempt(r) for r in requests))
            assert {o.weight_version for o in after} == {1}
            assert {o.receipt["weight_version"] for o in after} == {1}
            await _check_rows(after, data_plane, model, pad)  # the new weights' logprobs
            # Same seeds, new weights: the sampled responses changed.
            rows = await data_plane.get(STAGING_PARTITION, list(before_ids))
            changed = [
                k for k, ids in before_ids.items() if not np.array_equal(ids, rows[k]["input_ids"])
            ]
            assert changed, "no response changed after the weight update"
            # Old versions are pruned: only the newest keep_weight_versions stay.
            _train_step(model, tokenizer)
            await gate.update_weights(2)
            assert gate.weight_dirs.versions() == [1, 2]
            assert await client.weight_version() == "2"
        finally:
            await gate.close()

    asyncio.run(main())
