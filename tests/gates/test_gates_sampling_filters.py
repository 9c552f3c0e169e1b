"""The sampling filter: kept set, renormalization, top_k=1 is greedy, the trainer's kept target."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.gates.sampling_filters import SamplingParams, kept_tokens, sampling_logprobs

VOCAB = 12


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(
        st.floats(min_value=-8.0, max_value=8.0, allow_nan=False), min_size=VOCAB, max_size=VOCAB
    ),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    top_p=st.floats(min_value=0.01, max_value=1.0),
    top_k=st.integers(min_value=0, max_value=VOCAB + 2),
)
def test_the_kept_set_is_top_k_then_the_smallest_nucleus_renormalized(
    logits: list[float], temperature: float, top_p: float, top_k: int
) -> None:
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    raw = torch.tensor(logits)
    out = sampling_logprobs(raw, params)
    kept = torch.isfinite(out)
    full = torch.log_softmax(raw / temperature, dim=-1)
    assert kept.any()
    assert torch.equal(kept, kept_tokens(full, top_p=top_p, top_k=top_k))
    # Renormalized: the kept probabilities sum to 1 and keep their ratios.
    assert abs(float(out[kept].exp().sum()) - 1.0) < 1e-5
    shift = out[kept] - full[kept]
    assert float(shift.max() - shift.min()) < 1e-5
    # top-k: only tokens at least as likely as the k-th survive.
    if 0 < top_k < VOCAB:
        kth = torch.topk(full, top_k).values[-1]
        assert bool((full[kept] >= kth).all())
    # top-p over the top-k distribution: the kept set reaches top_p, and is the
    # smallest prefix (by probability) that does.
    in_k = kept_tokens(full, top_p=1.0, top_k=top_k)
    q = torch.softmax(full.masked_fill(~in_k, float("-inf")), dim=-1)
    mass = float(q[kept].sum())
    assert mass >= min(top_p, 1.0) - 1e-5
    if int(kept.sum()) > 1:
        assert mass - float(q[kept].min()) < top_p + 1e-6
    # Every token more likely than a kept one is kept too.
    if not kept.all():
        assert float(q[~kept].max()) <= float(q[kept].min()) + 1e-7


def test_without_truncation_it_is_the_temperature_softmax_exactly() -> None:
    logits = torch.randn(3, 5, VOCAB, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.7)
    assert not params.truncates
    assert torch.equal(sampling_logprobs(logits, params), torch.log_softmax(logits / 0.7, dim=-1))


def test_top_k_one_is_greedy() -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    out = sampling_logprobs(logits, SamplingParams(top_k=1))
    assert torch.equal(torch.isfinite(out).nonzero()[:, 1], logits.argmax(dim=-1))
    assert torch.equal(out.max(dim=-1).values, torch.zeros(4))


def test_a_kept_target_outside_the_nucleus_gets_a_finite_logprob() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -2.0]])
    params = SamplingParams(top_k=2)
    plain = sampling_logprobs(logits, params)
    assert torch.isinf(plain[0, 3])
    # The target is inside the set: nothing changes.
    assert torch.equal(sampling_logprobs(logits, params, keep=torch.tensor([0])), plain)
    kept = sampling_logprobs(logits, params, keep=torch.tensor([3]))
    assert torch.isfinite(kept[0, 3]) and torch.isinf(kept[0, 2])
    probs = torch.softmax(torch.tensor([4.0, 3.0, -2.0]), dim=-1)
    assert torch.allclose(kept[0, [0, 1, 3]].exp(), probs)


def test_ties_at_the_kth_are_kept_and_gradients_stay_finite() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]], requires_grad=True)
    out = sampling_logprobs(logits, SamplingParams(top_k=2, top_p=0.95), keep=torch.tensor([3]))
    assert torch.isfinite(out).tolist() == [[True, True, True, True]]
    out[0, 3].backward()
    assert logits.grad is not None and bool(torch.isfinite(logits.grad).all())


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_settings_are_refused(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**fields)
