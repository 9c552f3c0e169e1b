"""The clipped surrogate: its value, what it clips, what the mask hides, the KL term."""

from __future__ import annotations

import pytest
import torch

from rollvault.training.grpo_loss import grpo_loss


def _inputs(
    logprobs: list[float], generation: list[float], advantages: list[float], mask: list[float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([logprobs], requires_grad=True),
        torch.tensor([generation]),
        torch.tensor([advantages]),
        torch.tensor([mask]),
    )


def test_on_policy_loss_is_minus_the_mean_token_advantage() -> None:
    lp, gen, adv, mask = _inputs(
        [-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], [2.0, 2.0, -1.0], [1, 1, 1]
    )
    loss, stats = grpo_loss(lp, gen, adv, mask, clip_epsilon=0.2)
    assert loss.item() == pytest.approx(-(2.0 + 2.0 - 1.0) / 3)
    assert stats.mean_ratio == pytest.approx(1.0) and stats.clip_fraction == 0.0
    loss.backward()
    assert lp.grad is not None
    # Descending the loss raises the logprob of positive-advantage tokens and lowers the rest.
    assert lp.grad[0, 0] < 0 and lp.grad[0, 1] < 0 and lp.grad[0, 2] > 0


def test_ratio_beyond_the_clip_range_gets_no_gradient() -> None:
    # Token 0: ratio e^0.5 ~ 1.65 > 1.2 with A > 0: clipped. Token 1: ratio e^-0.5 with A > 0:
    # the unclipped term is smaller, so it still pushes.
    lp, gen, adv, mask = _inputs([-0.5, -1.5], [-1.0, -1.0], [1.0, 1.0], [1, 1])
    loss, stats = grpo_loss(lp, gen, adv, mask, clip_epsilon=0.2)
    loss.backward()
    assert lp.grad is not None
    assert lp.grad[0, 0] == 0.0 and lp.grad[0, 1] < 0
    assert stats.clip_fraction == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-(1.2 + torch.exp(torch.tensor(-0.5)).item()) / 2)


def test_masked_tokens_change_nothing() -> None:
    base = _inputs([-1.0, -2.0, -3.0], [-1.0, -2.5, -9.0], [1.0, 1.0, 5.0], [1, 1, 0])
    other = _inputs([-1.0, -2.0, 40.0], [-1.0, -2.5, -90.0], [1.0, 1.0, -7.0], [1, 1, 0])
    first, stats = grpo_loss(*base, clip_epsilon=0.2)
    second, _ = grpo_loss(*other, clip_epsilon=0.2)
    assert first.item() == pytest.approx(second.item())
    assert stats.tokens == 2 and torch.isfinite(second)


def test_an_all_masked_batch_has_zero_loss_and_a_gradient() -> None:
    lp, gen, adv, mask = _inputs([-1.0], [-3.0], [4.0], [0])
    loss, stats = grpo_loss(lp, gen, adv, mask, clip_epsilon=0.2)
    loss.backward()
    assert loss.item() == 0.0 and stats.tokens == 0
    assert lp.grad is not None and lp.grad.abs().sum() == 0


def test_kl_to_the_reference_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    lp, gen, adv, mask = _inputs([-1.0, -2.0], [-1.0, -2.0], [0.0, 0.0], [1, 1])
    same, stats = grpo_loss(
        lp, gen, adv, mask, clip_epsilon=0.2, reference_logprobs=lp.detach(), kl_coef=0.5
    )
    assert same.item() == pytest.approx(0.0) and stats.kl == pytest.approx(0.0)
    away, stats = grpo_loss(
        lp,
        gen,
        adv,
        mask,
        clip_epsilon=0.2,
        reference_logprobs=torch.tensor([[-1.5, -1.0]]),
        kl_coef=0.5,
    )
    assert stats.kl > 0 and away.item() == pytest.approx(0.5 * stats.kl)
    with pytest.raises(ValueError, match="reference_logprobs"):
        grpo_loss(lp, gen, adv, mask, clip_epsilon=0.2, kl_coef=0.1)


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="one shape"):
        grpo_loss(
            torch.zeros(1, 3),
            torch.zeros(1, 3),
            torch.zeros(1, 2),
            torch.ones(1, 3),
            clip_epsilon=0.2,
        )
