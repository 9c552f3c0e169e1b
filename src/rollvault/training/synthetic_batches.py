"""Training batches built without a run, for tests and benchmarks of a trainer step.

A run's batches come from the finalizer (canonical rows) and the replay index;
these build rows of the same shape straight from sampled responses: the
prompt's tokens first, out of the loss (mask 0, logprob and advantage 0), then
the response's tokens, in it, each with the response's advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.dataplane.rows import Row

__all__ = ["response_row", "step_group"]


def step_group(step: int, prompt_index: int) -> ReplayEntry:
    """The group of prompt ``prompt_index`` at ``step``, generated and trained at that step.

    Its id is ``s{step}p{prompt_index}``; its rows are ``{id}_g{k}`` (DESIGN.md, sibling).
    """
    return ReplayEntry(
        group_id=f"s{step}p{prompt_index}",
        sample_id=str(prompt_index),
        epoch=0,
        start_weight_version=step,
        end_weight_version=step,
        target_step=step,
    )


def response_row(
    prompt_ids: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    *,
    advantage: float,
    reward: float,
) -> Row:
    """One sibling's row: ``prompt_ids`` then the response ``token_ids`` (and their sampling
    ``logprobs``), the response's tokens trained with ``advantage``."""
    n_prompt, n_response = len(prompt_ids), len(token_ids)
    return {
        "input_ids": np.asarray([*prompt_ids, *token_ids], dtype=np.int64),
        "generation_logprobs": np.asarray([0.0] * n_prompt + list(logprobs), dtype=np.float32),
        "token_mask": np.asarray([0] * n_prompt + [1] * n_response, dtype=np.int8),
        "advantages": np.asarray([0.0] * n_prompt + [advantage] * n_response, dtype=np.float32),
        "reward": reward,
        "sample_mask": True,
    }
