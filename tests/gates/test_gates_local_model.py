"""The local model gate with a real worker process: rows, logprobs, versions, restarts."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from chat_model_helpers import IM_END, chatml_model_dir, token_id
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
from rollvault.gates.prompt_rendering import PromptFormat, PromptRenderer
from rollvault.gates.sampling import sample_batch
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.tasks.protocols import TextScore
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
            assert outcome.receipt["weight_version"] == outcome.weight_version
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


class _UpdatingGate(LocalModelGate):
    """Lands a weight update right after chosen batches: the trainer's step finishing
    while a batch runs, at the one moment that could split a group."""

    def __init__(self, *args: Any, updates: dict[int, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._updates = updates
        """Completed batch count -> the version to load after it."""

    async def _run_batch(self, batch: list[Any], *, hold: bool = False) -> None:
        await super()._run_batch(batch, hold=hold)
        if self.batches in self._updates:
            await self.update_weights(self._updates.pop(self.batches))


def _sibling(group: str, index: int) -> AttemptRequest:
    return AttemptRequest(
        group_id=group,
        generation_index=index,
        gate_rollout_id=f"{group}_g{index}_a{index}",
        prompt=dict(DATA[index]),
        weight_version=0,
    )


def test_a_group_is_generated_with_one_weight_version(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    model, _ = load_model_dir(model_dir)

    async def group(gate: LocalModelGate, name: str, size: int) -> set[int]:
        outcomes = await asyncio.gather(*(gate.run_attempt(_sibling(name, i)) for i in range(size)))
        assert {o.receipt["weight_version"] for o in outcomes} == {
            o.weight_version for o in outcomes
        }
        return {o.weight_version for o in outcomes}

    async def main() -> None:
        gate = _UpdatingGate(
            LocalModelGateConfig(temperature=1.0, max_new_tokens=4, max_batch_size=4),
            EmbeddedDataPlane(DataPlaneMutationCut()),
            AdditionEnvironment(),
            model_path=model_dir,
            weights_provider=_Weights(model),
            seed=0,
            updates={1: 1, 3: 2},
        )
        try:
            # Two groups of 3 with room for 4: the batch ends at the group boundary
            # ([a a a] [b b b], not [a a a b] [b b]), so the update lands between them.
            a, b = await asyncio.gather(group(gate, "a", 3), group(gate, "b", 3))
            assert (a, b) == ({0}, {1})
            assert gate.batches == 2 and gate.largest_batch == 3
            # A group larger than a batch is split ([big x4] [big, next x3]); the update
            # after its first part waits until its last sibling has started.
            big, following = await asyncio.gather(group(gate, "big", 5), group(gate, "next", 3))
            assert (big, following) == ({1}, {1})
            assert gate.batches == 4
            # Then the held version is released.
            assert await group(gate, "late", 2) == {2}
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


class _RecordingEnvironment:
    """Scores every response 0 and keeps the text it was given, by prompt index."""

    def __init__(self) -> None:
        self.texts: dict[int, tuple[str, bool]] = {}

    async def score_text(
        self, prompt: Mapping[str, Any], response_text: str, *, finished: bool
    ) -> TextScore:
        self.texts[int(prompt["idx"])] = (response_text, finished)
        return TextScore(reward=0.0, format_ok=True, correct=False)


def _chat_request(index: int, prompt: dict[str, Any]) -> AttemptRequest:
    return AttemptRequest(
        group_id=f"c{index}",
        generation_index=0,
        gate_rollout_id=f"c{index}_g0_a{index}",
        prompt={"idx": index, **prompt},
        weight_version=0,
    )


def test_chat_prompts_stop_on_any_stop_token_and_match_the_trainer(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = chatml_model_dir(tmp_path / "chat")
    model, tokenizer = load_model_dir(model_dir)
    eos, end = int(tokenizer.eos_token_id), token_id(tokenizer, IM_END)
    environment = _RecordingEnvironment()
    prompt_format = PromptFormat(chat_template=True, system_prompt="add")
    renderer = PromptRenderer(tokenizer, prompt_format, model_path=model_dir)
    config = LocalModelGateConfig(temperature=0.9, top_p=0.9, top_k=5, max_new_tokens=6)
    prompts = [
        {"prompt_text": f"{i}+{i}="}
        if i % 2
        else {"messages": [{"role": "user", "content": f"{i}"}]}
        for i in range(24)
    ]
    # A third stop token, in generation_config.json: the token this model draws most here.
    drawn = sample_batch(
        model,
        [renderer.prompt_ids(p) for p in prompts],
        seeds=range(len(prompts)),
        max_new_tokens=6,
        temperature=0.9,
        top_p=0.9,
        top_k=5,
        stop_token_ids=[eos, end],
        pad_token_id=int(tokenizer.pad_token_id),
    )
    counts = Counter(t for s in drawn for t in s.token_ids if t not in (eos, end))
    common = counts.most_common(1)[0][0]
    chatml_model_dir(model_dir, generation_eos=[eos, common])

    async def main() -> None:
        data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        gate = LocalModelGate(
            config,
            data_plane,
            environment,
            model_path=model_dir,
            weights_provider=_Weights(model),
            prompt_format=prompt_format,
        )
        try:
            assert gate.stop_token_ids == [eos, common, end]
            outcomes = await asyncio.gather(
                *(gate.run_attempt(_chat_request(i, p)) for i, p in enumerate(prompts))
            )
            keys = [o.receipt["staging_keys"][0] for o in outcomes]
            rows = await data_plane.get(STAGING_PARTITION, keys)
        finally:
            await gate.close()
        stops = {eos, common, end}
        last_tokens = set()
        sequences, lengths = [], []
        for index, key in enumerate(keys):
            row = rows[key]
            ids = np.asarray(row["input_ids"]).tolist()
            length = int(row["prompt_length"])
            assert ids[:length] == renderer.prompt_ids({"idx": index, **prompts[index]})
            response = ids[length:]
            text, finished = environment.texts[index]
            assert finished == (response[-1] in stops)
            assert not stops & set(response[:-1])
            # The environment never sees the stop token.
            kept = response[:-1] if finished else response
            assert text == tokenizer.decode(kept, skip_special_tokens=False)
            last_tokens.add(response[-1])
            sequences.append(ids)
            lengths.append(length)
        assert common in last_tokens  # rows stopped on the generation config's stop token
        recomputed = sequence_logprobs(
            model,
            sequences,
            temperature=0.9,
            top_p=0.9,
            top_k=5,
            pad_token_id=int(tokenizer.pad_token_id),
        )
        for key, length, again in zip(keys, lengths, recomputed, strict=True):
            generated = np.asarray(rows[key]["generation_logprobs"])
            np.testing.assert_allclose(again[length:], generated[length:], atol=1e-5)

    asyncio.run(main())


def test_chat_messages_without_chat_template_fail_the_attempt_as_data(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    model, _ = load_model_dir(model_dir)

    async def main() -> None:
        gate = _gate(model_dir, _Weights(model), EmbeddedDataPlane(DataPlaneMutationCut()))
        try:
            request = _chat_request(0, {"messages": [{"role": "user", "content": "1+1="}]})
            with pytest.raises(GateAttemptError) as info:
                await gate.run_attempt(request)
            assert info.value.kind is FailureKind.DATA
            assert "model.chat_template" in str(info.value)
        finally:
            await gate.close()

    asyncio.run(main())
