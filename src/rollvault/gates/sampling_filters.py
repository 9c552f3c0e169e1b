"""The distribution tokens are drawn from: temperature, then top-k, then top-p, renormalized.

:func:`sampling_logprobs` is the one definition of it. The generation worker
draws from it and reports the drawn token's logprob under it; the GRPO
trainer recomputes logprobs with it
(:func:`rollvault.training.logprobs.token_logprobs`). With the same weights
both therefore give the same number, which is what makes an on-policy
importance ratio 1 even when sampling truncates the distribution.

Order and ties follow Hugging Face's ``generate``: logits are divided by the
temperature, top-k keeps every token at least as likely as the k-th (so a
tie at the k-th keeps all of them), and top-p then keeps, in order of
decreasing probability under the top-k distribution, every token whose
predecessors' mass is still below ``top_p`` (the smallest prefix reaching
``top_p``; the most likely token always stays). The kept tokens' probabilities
are renormalized to sum to 1.

The trainer passes its target tokens as ``keep``: they stay in the kept set
even when they fall outside it. With the weights that sampled them that
changes nothing (a drawn token was in the set). After an update a sampled
token can fall outside the new policy's nucleus; its logprob would be -inf
and its importance ratio 0, and a prompt token (never sampled, often outside
any nucleus) would turn the masked loss into NaN (``-inf * 0``). Keeping the
target gives it its renormalized probability instead: a finite, small
logprob whose ratio the GRPO clip bounds, the usual safe choice.
"""

from __future__ import annotations

import msgspec
import torch

__all__ = ["SamplingParams", "kept_tokens", "sampling_logprobs"]


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How a token is drawn from a model's logits (see the module docstring)."""

    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1.0 keeps every token."""
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens; 0 keeps every token."""

    def __post_init__(self) -> None:
        if not self.temperature > 0.0:
            raise ValueError(f"SamplingParams: temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams: top_k must be >= 0, got {self.top_k}")

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p may remove tokens (else: plain temperature softmax)."""
        return self.top_p < 1.0 or self.top_k > 0


def sampling_logprobs(
    logits: torch.Tensor, params: SamplingParams, *, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Float32 log-probabilities ``[..., vocab]`` of the sampling distribution.

    Tokens outside the kept set get ``-inf``. ``keep`` (integer ids of shape
    ``logits.shape[:-1]``) names one token per position that stays in the set
    whatever its probability. Without truncation this is exactly
    ``log_softmax(logits / temperature)``. Differentiable in ``logits``.
    """
    logprobs = torch.log_softmax(logits.float() / params.temperature, dim=-1)
    if not params.truncates:
        return logprobs
    with torch.no_grad():
        kept = kept_tokens(logprobs, top_p=params.top_p, top_k=params.top_k)
        if keep is not None:
            kept = kept.scatter(-1, keep.unsqueeze(-1), torch.ones_like(kept[..., :1]))
    truncated = logprobs.masked_fill(~kept, float("-inf"))
    return truncated - torch.logsumexp(truncated, dim=-1, keepdim=True)


def kept_tokens(logprobs: torch.Tensor, *, top_p: float, top_k: int) -> torch.Tensor:
    """Boolean ``[..., vocab]``: the tokens top-k and then top-p keep (never none)."""
    vocab = logprobs.shape[-1]
    kept = torch.ones_like(logprobs, dtype=torch.bool)
    if 0 < top_k < vocab:
        kth = torch.topk(logprobs, top_k, dim=-1).values[..., -1:]
        kept = logprobs >= kth
    if top_p < 1.0:
        probs = torch.softmax(logprobs.masked_fill(~kept, float("-inf")), dim=-1)
        # A stable sort orders equal probabilities by id, in the worker and the trainer alike.
        ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(ordered, dim=-1) - ordered
        in_nucleus = mass_before < top_p
        in_nucleus[..., 0] = True
        kept = kept & torch.zeros_like(kept).scatter(-1, order, in_nucleus)
    return kept
