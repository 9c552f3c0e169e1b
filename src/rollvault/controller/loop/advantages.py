"""Group-relative advantages, GRPO's baseline.

Each sibling's advantage is its reward minus the mean reward of the valid
siblings of its group, optionally divided by their standard deviation plus
epsilon. A masked (invalid) sibling gets advantage 0 and does not move the
baseline: it is published only so that the group still has exactly N rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def group_advantages(
    rewards: Sequence[float],
    valid: Sequence[bool],
    *,
    normalize_by_std: bool,
    epsilon: float,
) -> npt.NDArray[np.float32]:
    """Return one advantage per sibling, in sibling order."""
    if len(rewards) != len(valid):
        raise ValueError(
            f"group_advantages: {len(rewards)} rewards but {len(valid)} validity flags"
        )
    if epsilon <= 0:
        raise ValueError(f"group_advantages: epsilon must be > 0, got {epsilon}")
    reward_array = np.asarray(rewards, dtype=np.float64)
    mask = np.asarray(valid, dtype=bool)
    advantages = np.zeros(len(reward_array), dtype=np.float64)
    if mask.any():
        chosen = reward_array[mask]
        centred = chosen - chosen.mean()
        if normalize_by_std:
            centred = centred / (chosen.std() + epsilon)
        advantages[mask] = centred
    return advantages.astype(np.float32)
