"""Per-token logprobs of given sequences under a causal LM, for the loss.

Sequences are left-padded into one batch, exactly as the generation worker
batches prompts (:func:`rollvault.gates.sampling.left_pad`): the attention
mask hides the padding and position ids count real tokens only, so a
sequence gets the same logprobs whatever it is batched with. Logprobs come
from :func:`rollvault.gates.sampling_filters.sampling_logprobs` with the
gate's temperature, top-p and top-k, the distribution the worker drew the
tokens from, so an on-policy token's importance ratio is 1. Each target token
is kept in its position's top-p/top-k set (see that module for why), so its
logprob is always finite.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from rollvault.gates.sampling import LeftPadded, left_pad
from rollvault.gates.sampling_filters import SamplingParams, sampling_logprobs

__all__ = ["left_pad_values", "sequence_logprobs", "token_logprobs"]


def token_logprobs(
    model: PreTrainedModel,
    batch: LeftPadded,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
) -> torch.Tensor:
    """``[batch, length]``: entry ``j`` is log p(token j | tokens before j) for j >= 1.

    Position 0 of each sequence and padding get 0. Float32 whatever the
    model's dtype. Differentiable when the model's parameters require grad.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    targets = batch.input_ids[:, 1:]
    predicted = sampling_logprobs(logits[:, :-1, :], params, keep=targets)
    taken = predicted.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # A token is predicted only from a real previous token: that excludes each
    # sequence's first token, whose "previous" position is padding.
    valid = batch.attention_mask[:, 1:] * batch.attention_mask[:, :-1]
    taken = taken * valid
    return torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=-1)


def sequence_logprobs(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float,
    pad_token_id: int,
    top_p: float = 1.0,
    top_k: int = 0,
) -> list[np.ndarray]:
    """Each sequence's per-token logprobs (float32, 0 at position 0), unpadded again."""
    batch = left_pad(sequences, pad_token_id)
    with torch.no_grad():
        padded = token_logprobs(model, batch, temperature=temperature, top_p=top_p, top_k=top_k)
    length = padded.shape[1]
    return [
        padded[row, length - len(seq) :].numpy().astype(np.float32)
        for row, seq in enumerate(sequences)
    ]


def left_pad_values(
    arrays: Sequence[np.ndarray], length: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Left-pad per-token arrays with zeros to ``length``, aligned with :func:`left_pad`."""
    out = torch.zeros((len(arrays), length), dtype=dtype)
    for row, values in enumerate(arrays):
        if len(values):
            out[row, length - len(values) :] = torch.tensor(np.asarray(values), dtype=dtype)
    return out
