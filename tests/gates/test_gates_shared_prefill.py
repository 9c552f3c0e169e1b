"""Siblings with one prompt are prefilled once, and sample exactly as they would alone."""

from __future__ import annotations

import pytest
import torch

from rollvault.gates.sampling import sample_batch
from rollvault.training.model_store import build_default_model
from rollvault.training.tokenizer import build_char_tokenizer


@pytest.mark.parametrize("top_k", [0, 5])
def test_a_shared_prompt_samples_what_each_row_samples_alone(top_k: int) -> None:
    tokenizer = build_char_tokenizer()
    model = build_default_model(tokenizer, seed=3)
    ids = [list(tokenizer("12+34=", add_special_tokens=False).input_ids)] * 4
    ids += [list(tokenizer("7+8=", add_special_tokens=False).input_ids)] * 3
    seeds = list(range(100, 107))
    forwards: list[int] = []
    hook = model.register_forward_hook(lambda _m, args, _out: forwards.append(0))
    settings = {
        "max_new_tokens": 5,
        "temperature": 1.0,
        "top_k": top_k,
        "stop_token_ids": [int(tokenizer.eos_token_id)],
        "pad_token_id": int(tokenizer.pad_token_id),
    }
    together = sample_batch(model, ids, seeds=seeds, **settings)  # type: ignore[arg-type]
    hook.remove()
    alone = [
        sample_batch(model, [prompt], seeds=[seed], **settings)[0]  # type: ignore[arg-type]
        for prompt, seed in zip(ids, seeds, strict=True)
    ]
    for shared, single in zip(together, alone, strict=True):
        assert shared.token_ids == single.token_ids
        assert shared.finished == single.finished
        torch.testing.assert_close(
            torch.tensor(shared.logprobs), torch.tensor(single.logprobs), atol=1e-5, rtol=1e-5
        )
    # An untrained model rarely stops: most rows decode all 5 tokens, so distinct
    # answers must come from distinct seeds, not from one copied row.
    assert len({tuple(s.token_ids) for s in together[:4]}) > 1
    assert len(forwards) <= 5  # one prefill of the 2 distinct prompts, then one per token


def test_the_prefill_runs_the_distinct_prompts_only() -> None:
    tokenizer = build_char_tokenizer()
    model = build_default_model(tokenizer, seed=3)
    batch_rows: list[int] = []
    hook = model.register_forward_hook(
        lambda _m, _args, out: batch_rows.append(int(out.logits.shape[0]))
    )
    prompt = list(tokenizer("55+44=", add_special_tokens=False).input_ids)
    sampled = sample_batch(
        model,
        [prompt] * 8,
        seeds=list(range(8)),
        max_new_tokens=2,
        temperature=1.0,
        stop_token_ids=[int(tokenizer.eos_token_id)],
        pad_token_id=int(tokenizer.pad_token_id),
    )
    hook.remove()
    # The prefill saw one row; the decode step every row not done after its first token.
    assert batch_rows == [1, sum(len(s.token_ids) == 2 for s in sampled)]
    assert batch_rows[1] > 1
