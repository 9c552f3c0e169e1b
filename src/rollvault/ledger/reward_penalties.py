"""Reward observations and penalty settings carried through the ledger.

These are the spec's ``reward_penalties`` types. They are small, frozen and
JSON-safe (msgspec Structs with strict decoding), because they are persisted
in the ledger sidecar next to the attempt that produced them.
"""

from __future__ import annotations

import msgspec


class RewardChecks(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Per-sibling validity checks the Gate ran on one generation.

    The finalizer turns a failed check into a penalty or a masked row,
    according to :class:`CaptureRewardSettings`.
    """

    overlong: bool
    """The response hit the generation length limit without stopping."""
    format_ok: bool
    """The response matched the task's required output format."""
    finite_logprobs: bool
    """Every captured log-probability is finite."""


class RewardLogContext(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Token-free context logged with a sibling's reward."""

    response_length: int
    """Number of generated tokens in the response."""
    stop_reason: str
    """Why generation stopped, as the Gate reported it (for example ``"stop"``, ``"length"``)."""


class FinalizedReward(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One sibling's reward after the finalizer applied checks and penalties."""

    raw_reward: float
    """The reward the environment returned."""
    reward: float
    """The reward used for the advantage, after penalties."""
    masked: bool
    """Whether the sibling became a masked (zero-weight) canonical row."""


class CaptureRewardSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Reward-penalty configuration in force when rewards were captured.

    Persisted with the sidecar so a restore can refuse to re-finalize sealed
    siblings under different penalty rules.
    """

    overlong_penalty: float
    """Subtracted from the reward of an overlong response (0.0 disables it)."""
    mask_overlong: bool
    """Mask overlong responses instead of penalising them."""
    format_penalty: float
    """Subtracted from the reward of a response whose format check failed."""
    mask_nonfinite_logprobs: bool
    """Mask responses whose captured log-probabilities are not all finite."""
