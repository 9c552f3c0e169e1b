"""The GRPO loss: clipped surrogate on the importance ratio, optional KL penalty.

Per response token ``t`` with advantage ``A`` (the group-relative advantage
of its sequence), the importance ratio against the policy that generated it
is ``r = exp(logp(t) - logp_generation(t))`` and the loss is

    -min(r * A, clip(r, 1 - eps, 1 + eps) * A)

averaged over every response token of the batch (token-level mean, so long
responses weigh by their length). With ``kl_coef > 0`` the k3 estimator of
KL(policy || reference), ``exp(ref - logp) - (ref - logp) - 1``, is added with
that weight. Tokens outside ``token_mask`` (prompts, padding, masked samples)
contribute nothing.

Micro-batches: given ``token_count``, the sums are divided by it instead of
by the mask's own token count. Each micro-batch of a batch passes the whole
batch's count, so their losses (hence their gradients) and their stats add
up to the whole batch's.
"""

from __future__ import annotations

import msgspec
import torch

__all__ = ["GrpoLossStats", "grpo_loss", "summed_stats"]


class GrpoLossStats(msgspec.Struct, frozen=True, kw_only=True):
    """Diagnostics of one loss evaluation (token-level means over the mask)."""

    policy_loss: float
    kl: float
    clip_fraction: float
    """Share of tokens whose ratio the clip cut off (the min chose the clipped term)."""
    mean_ratio: float
    tokens: int


def grpo_loss(
    logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    clip_epsilon: float,
    reference_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_count: int | None = None,
) -> tuple[torch.Tensor, GrpoLossStats]:
    """The loss (a scalar tensor) and its diagnostics; all inputs are ``[batch, length]``.

    ``token_count``: the denominator of every mean (None: the mask's token count).
    """
    shapes = {t.shape for t in (logprobs, generation_logprobs, advantages, token_mask)}
    if len(shapes) != 1:
        raise ValueError(
            f"grpo_loss: inputs must share one shape, got {sorted(map(tuple, shapes))}"
        )
    if kl_coef > 0.0 and reference_logprobs is None:
        raise ValueError("grpo_loss: kl_coef > 0 needs reference_logprobs")
    mask = token_mask.to(logprobs.dtype)
    tokens = mask.sum()
    if token_count is None:
        denominator = tokens.clamp(min=1.0)
    else:
        denominator = torch.tensor(float(max(token_count, 1)), dtype=mask.dtype)
    # Outside the mask the two logprobs need not agree (a masked sample keeps
    # its generation logprobs); zero the log ratio there so exp() cannot overflow.
    log_ratio = (logprobs - generation_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon) * advantages
    policy_loss = (-torch.minimum(unclipped, clipped) * mask).sum() / denominator
    loss = policy_loss
    kl_value = torch.zeros(())
    if reference_logprobs is not None and kl_coef > 0.0:
        delta = (reference_logprobs - logprobs) * mask
        kl_value = ((torch.exp(delta) - delta - 1.0) * mask).sum() / denominator
        loss = loss + kl_coef * kl_value
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(mask.dtype) * mask
        stats = GrpoLossStats(
            policy_loss=float(policy_loss),
            kl=float(kl_value),
            clip_fraction=float(was_clipped.sum() / denominator),
            mean_ratio=float((ratio * mask).sum() / denominator),
            tokens=int(tokens),
        )
    return loss, stats


def summed_stats(parts: list[GrpoLossStats]) -> GrpoLossStats:
    """The stats of a batch from those of its micro-batches (each with the batch's
    ``token_count``): every field is a sum over them."""
    if not parts:
        raise ValueError("summed_stats: no micro-batch stats")
    return GrpoLossStats(
        policy_loss=sum(p.policy_loss for p in parts),
        kl=sum(p.kl for p in parts),
        clip_fraction=sum(p.clip_fraction for p in parts),
        mean_ratio=sum(p.mean_ratio for p in parts),
        tokens=sum(p.tokens for p in parts),
    )
