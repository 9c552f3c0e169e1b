"""Generation logprobs (worker's sampling loop) agree with the trainer's recomputation."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from grpo_test_helpers import build_model, prompt_ids
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.gates.sampling import left_pad, sample_batch
from rollvault.training.logprobs import sequence_logprobs

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def policy(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return build_model(tmp_path_factory.mktemp("model") / "model", seed=5)


def test_left_pad_positions_count_real_tokens_only() -> None:
    batch = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    with pytest.raises(ValueError, match="empty"):
        left_pad([[1], []], pad_token_id=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_recomputation_in_a_left_padded_batch(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], temperature: float
) -> None:
    model, tokenizer = policy
    # Prompts of different lengths, so the short ones are left-padded in both passes.
    texts = ["07+35=", "1+2=", "99+99=", "3=", "12*3-4="]
    prompts = [prompt_ids(tokenizer, t) for t in texts]
    sampled = sample_batch(
        model,
        prompts,
        seeds=list(range(len(prompts))),
        max_new_tokens=6,
        temperature=temperature,
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    sequences = [p + s.token_ids for p, s in zip(prompts, sampled, strict=True)]
    batched = sequence_logprobs(
        model, sequences, temperature=temperature, pad_token_id=int(tokenizer.pad_token_id)
    )
    for prompt, sample, recomputed, sequence in zip(
        prompts, sampled, batched, sequences, strict=True
    ):
        assert len(sample.logprobs) == len(sample.token_ids) >= 1
        assert all(lp <= 0.0 for lp in sample.logprobs)
        np.testing.assert_allclose(recomputed[len(prompt) :], sample.logprobs, atol=TOLERANCE)
        assert recomputed[0] == 0.0
        # Alone (no padding at all) gives the same numbers: padding changes nothing.
        alone = sequence_logprobs(
            model, [sequence], temperature=temperature, pad_token_id=int(tokenizer.pad_token_id)
        )[0]
        np.testing.assert_allclose(alone, recomputed, atol=TOLERANCE)


def test_sampling_is_a_function_of_the_seed_not_of_the_batch(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tokenizer = policy
    generate = functools.partial(
        sample_batch,
        model,
        max_new_tokens=6,
        temperature=1.0,
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    target = prompt_ids(tokenizer, "42+17=")
    alone = generate([target], seeds=[11])[0]
    batched = generate([prompt_ids(tokenizer, "5="), target], seeds=[3, 11])[1]
    assert batched.token_ids == alone.token_ids
    np.testing.assert_allclose(batched.logprobs, alone.logprobs, atol=TOLERANCE)
    stops = [s for s in generate([target] * 16, seeds=range(16))]
    for sample in stops:
        # A row stops at eos: eos only ever comes last, and only then is it "finished".
        eos = int(tokenizer.eos_token_id)
        assert eos not in sample.token_ids[:-1]
        assert sample.finished == (sample.token_ids[-1] == eos)
