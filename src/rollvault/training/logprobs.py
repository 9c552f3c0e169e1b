"""Per-token logprobs of given sequences under a causal LM, for the loss.

Sequences are left-padded into one batch, exactly as the generation worker
batches prompts (:func:`rollvault.gates.sampling.left_pad`): the attention
mask hides the padding and position ids count real tokens only, so a
sequence gets the same logprobs whatever it is batched with. Logits are
divided by the sampling temperature, as the worker did when it drew the
tokens, so an on-policy token's importance ratio is 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from rollvault.gates.sampling import LeftPadded, left_pad

__all__ = ["left_pad_values", "sequence_logprobs", "token_logprobs"]


def token_logprobs(
    model: PreTrainedModel, batch: LeftPadded, *, temperature: float
) -> torch.Tensor:
    """``[batch, length]``: entry ``j`` is log p(token j | tokens before j) for j >= 1.

    Position 0 of each sequence and padding get 0. Differentiable when the
    model's parameters require grad.
    """
    if temperature <= 0.0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    predicted = torch.log_softmax(logits[:, :-1, :].float() / temperature, dim=-1)
    taken = predicted.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
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
) -> list[np.ndarray]:
    """Each sequence's per-token logprobs (float32, 0 at position 0), unpadded again."""
    batch = left_pad(sequences, pad_token_id)
    with torch.no_grad():
        padded = token_logprobs(model, batch, temperature=temperature)
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
