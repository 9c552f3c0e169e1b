"""The local model gate with a real worker process: rows, logprobs, versions, restarts."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load

from rollvault.config.schema import LocalModelGateConfig
from rollvault.controller.loop.gate import (
    AttemptRequest,
    FailureKind,
    GateAttemptError,
    staged_row_digest,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.gates.local_model import LocalModelGate
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.training.logprobs import sequence_logprobs
from rollvault.training.model_store import ensure_model_dir, load_model_dir

pytestmark = pytest.mark.slow

DATA = AdditionPromptDataset(64, seed=0)


def _request(index: int, attempt: str = "a") -> AttemptRequest:
    return AttemptRequest(
        group_id=f"g{index}",
        generation_index=0,
        gate_rollout_id=f"g{index}_g0_{attempt}{index}",
        prompt=dict(DATA[index]),
        weight_version=0,
    )


class _Weights:
    """A weights provider the test can change, like a trainer between steps."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self) -> bytes:
        from safetensors.torch import save

        return save(
            {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}
        )


def _gate(model_dir: Path, weights: _Weights, data_plane: EmbeddedDataPlane) -> LocalModelGate:
    return LocalModelGate(
        LocalModelGateConfig(temperature=1.0, max_new_tokens=6, max_batch_size=64),
        data_plane,
        AdditionEnvironment(),
        model_path=model_dir,
        weights_provider=weights,
        seed=0,
    )


def test_attempts_stage_rows_whose_logprobs_the_trainer_reproduces(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    model, tokenizer = load_model_dir(model_dir)
    weights = _Weights(model)

    async def main() -> None:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        gate = _gate(model_dir, weights, data_plane)
        try:
            outcomes = await asyncio.gather(*(gate.run_attempt(_request(i)) for i in range(24)))
            # Requests that waited together went to the worker together.
            assert gate.batches < 24 and gate.largest_batch > 1
            assert {o.weight_version for o in outcomes} == {0}
            await _check_rows(outcomes, data_plane)
            # New weights under version 1: later attempts report it and match them.
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.mul_(1.05)
            await gate.update_weights(1)
            later = await asyncio.gather(
                *(gate.run_attempt(_request(i, "b")) for i in range(24, 32))
            )
            assert {o.weight_version for o in later} == {1}
            await _check_rows(later, data_plane)
            with pytest.raises(ValueError, match="went back"):
                await gate.update_weights(0)
        finally:
            await gate.close()

    async def _check_rows(outcomes: list, data_plane: EmbeddedDataPlane) -> None:
        keys = [o.receipt["staging_keys"][0] for o in outcomes]
        rows = await data_plane.get(STAGING_PARTITION, keys)
        sequences, prompt_lengths = [], []
        for outcome, key in zip(outcomes, keys, strict=True):
            row = rows[key]
            assert staged_row_digest(row) == outcome.receipt["row_digests"][0]["digest"]
            length = int(row["prompt_length"])
            assert int(np.asarray(row["token_mask"]).sum()) == outcome.num_tokens
            assert not np.asarray(row["token_mask"])[:length].any()
            sequences.append(np.asarray(row["input_ids"]).tolist())
            prompt_lengths.append(length)
        recomputed = sequence_logprobs(
            model, sequences, temperature=1.0, pad_token_id=int(tokenizer.pad_token_id)
        )
        for key, length, again in zip(keys, prompt_lengths, recomputed, strict=True):
            generated = np.asarray(rows[key]["generation_logprobs"])
            np.testing.assert_allclose(again[length:], generated[length:], atol=1e-4)

    asyncio.run(main())
    assert load(weights())  # the provider itself stayed usable


def test_a_killed_worker_fails_its_attempts_as_infra_and_is_restarted(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    model, _ = load_model_dir(model_dir)

    async def main() -> None:
        gate = _gate(model_dir, _Weights(model), EmbeddedDataPlane(DataPlaneMutationCut()))
        try:
            await gate.run_attempt(_request(0))  # the worker is up and has served a batch
            first_pid = gate.worker_pid
            os.kill(first_pid, signal.SIGKILL)
            with pytest.raises(GateAttemptError) as info:
                await gate.run_attempt(_request(1))
            assert info.value.kind is FailureKind.INFRA
            outcomes = await asyncio.gather(*(gate.run_attempt(_request(i)) for i in range(2, 6)))
            assert all(o.num_tokens > 0 for o in outcomes)
            assert gate.worker_restarts == 1 and gate.worker_pid != first_pid
        finally:
            await gate.close()

    asyncio.run(main())


def test_the_worker_ignores_sigterm_and_sigint_and_stops_when_the_gate_closes(
    tmp_path: Path,
) -> None:
    # A scheduler may signal every process of the job, a Ctrl-C the whole process
    # group: the worker keeps serving, and the parent stops it after its final snapshot.
    torch.set_num_threads(1)
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    model, _ = load_model_dir(model_dir)

    async def main() -> int:
        gate = _gate(model_dir, _Weights(model), EmbeddedDataPlane(DataPlaneMutationCut()))
        try:
            await gate.run_attempt(_request(0))  # the worker is up, its handlers installed
            pid = gate.worker_pid
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
            outcome = await gate.run_attempt(_request(1))
            assert outcome.num_tokens > 0
            assert gate.worker_restarts == 0 and gate.worker_pid == pid
        finally:
            await gate.close()
        return pid

    pid = asyncio.run(main())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped by close()
