"""Sampling a batch of prompts (temperature, top-k, top-p), with per-token logprobs.

Prompts of different lengths are left-padded into one batch. Position ids
then count real tokens only (``cumsum(attention_mask) - 1``), so a padded
prompt sees its tokens at the positions it has alone and in the trainer's
recomputation. (A rotary model such as the default would tolerate the
uniform shift that padding causes, up to rounding; a model with absolute
position embeddings would not.)

Tokens are drawn from :func:`rollvault.gates.sampling_filters.sampling_logprobs`
(softmax of ``logits / temperature``, truncated by top-k and top-p and
renormalized; no repetition penalty), and the logprob reported for a token is
exactly the log of the probability it was drawn with; the trainer recomputes
it with the same function. Each prompt draws from its own seeded generator,
so its tokens do not depend on what it was batched with. A row stops at the
first of its ``stop_token_ids`` (eos, a chat template's end-of-turn token),
which is kept as its last token.

Equal prompts in a batch (the siblings of a group) are prefilled once: the
distinct prompts go through the model and their KV cache rows are repeated
for every row that asked for them, which takes the prompt tokens' compute
off all but one sibling of each group. A row that is done (stop token or
limit) leaves the decoding batch with its cache rows, so the later tokens
of the longest responses do not pay for the rows that ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import torch
from transformers import PreTrainedModel

from rollvault.gates.causal_lm import cache_argument_name, output_cache
from rollvault.gates.sampling_filters import SamplingParams, sampling_logprobs

__all__ = ["LeftPadded", "SampledSequence", "left_pad", "sample_batch"]


class LeftPadded(msgspec.Struct, frozen=True):
    """A left-padded batch: ids, attention mask and position ids, each [batch, length]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor


class SampledSequence(msgspec.Struct, frozen=True):
    """One prompt's response: its tokens, their logprobs, and whether it ended with a stop token."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> LeftPadded:
    """Left-pad ``sequences`` to one length; positions count real tokens from 0."""
    if not sequences or any(len(sequence) == 0 for sequence in sequences):
        raise ValueError("left_pad: needs at least one sequence, and no empty sequence")
    length = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, length - len(sequence) :] = torch.as_tensor(list(sequence), dtype=torch.long)
        mask[row, length - len(sequence) :] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    return LeftPadded(input_ids=ids, attention_mask=mask, position_ids=positions)


@torch.inference_mode()  # cheaper than no_grad: no version counters, no views tracked
def sample_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    seeds: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
    top_p: float = 1.0,
    top_k: int = 0,
    row_limits: Sequence[int | None] | None = None,
) -> list[SampledSequence]:
    """Sample up to ``max_new_tokens`` tokens after each prompt; stop a row at a stop token.

    ``row_limits``: per row, a smaller limit (a chunk of a turn: ``rollout.prefix_resume``);
    None keeps ``max_new_tokens``. A row cut at its limit is not finished.
    """
    if len(seeds) != len(prompts):
        raise ValueError(f"sample_batch: {len(prompts)} prompts but {len(seeds)} seeds")
    limits = [
        max_new_tokens if limit is None else min(limit, max_new_tokens)
        for limit in (row_limits if row_limits is not None else [None] * len(prompts))
    ]
    if len(limits) != len(prompts) or min(limits, default=1) < 1:
        raise ValueError(
            f"sample_batch: needs one row limit >= 1 per prompt, got {row_limits} for "
            f"{len(prompts)} prompts"
        )
    if max_new_tokens < 1 or not stop_token_ids:
        raise ValueError(
            f"sample_batch: needs max_new_tokens >= 1 and at least one stop token, "
            f"got {max_new_tokens} and {list(stop_token_ids)}"
        )
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    stops = frozenset(stop_token_ids)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    cache_name = cache_argument_name(model)
    output, last_logits, batch = _prefill(model, prompts, pad_token_id)
    mask = batch.attention_mask
    positions = batch.position_ids[:, -1:]
    tokens: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    finished = [False] * len(prompts)
    done = [False] * len(prompts)
    """Finished, or at its row limit."""
    longest = max(limits)
    rows = list(range(len(prompts)))
    """The prompt of each row of the decoding batch."""
    for step in range(longest):
        step_logprobs = sampling_logprobs(last_logits, params)
        chosen = _draw(
            step_logprobs.exp(), [generators[row] for row in rows], [done[row] for row in rows]
        )
        # One gather and two lists per step: no tensor indexing per row.
        chosen_logprobs = step_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
        for row, token, logprob in zip(rows, chosen.tolist(), chosen_logprobs, strict=True):
            if done[row]:  # a model whose cache cannot be reordered keeps done rows
                continue
            tokens[row].append(token)
            logprobs[row].append(logprob)
            finished[row] = token in stops
            done[row] = finished[row] or len(tokens[row]) >= limits[row]
        if all(done) or step == longest - 1:
            break
        cache = output_cache(output)
        keep = [i for i, row in enumerate(rows) if not done[row]]
        if len(keep) < len(rows) and hasattr(cache, "reorder_cache"):
            # Rows that are done leave the batch (their cache rows too): most responses
            # end several tokens before the longest, so later steps decode fewer rows.
            index = torch.tensor(keep, dtype=torch.long)
            cache.reorder_cache(index)
            rows = [rows[i] for i in keep]
            mask, positions, chosen = mask[index], positions[index], chosen[index]
        # Otherwise done rows keep decoding (their tokens are ignored).
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        positions = positions + 1
        output = model(
            input_ids=chosen.unsqueeze(-1),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_name: cache},
        )
        last_logits = output.logits[:, -1, :]
    return [
        SampledSequence(token_ids=t, logprobs=lp, finished=f)
        for t, lp, f in zip(tokens, logprobs, finished, strict=True)
    ]


def _prefill(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[Any, torch.Tensor, LeftPadded]:
    """The prompts' forward pass: its output (with the KV cache), each row's last logits, and
    the batch of every row.

    Equal prompts (a group's siblings) go through the model once: the distinct
    prompts are prefilled, and their cache rows, logits, mask and positions are
    then repeated for every row that asked for them (a model whose cache cannot
    be reordered prefills every row).
    """
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(prompt), len(distinct)) for prompt in prompts]
    shared = len(distinct) < len(prompts)
    batch = left_pad(list(distinct) if shared else prompts, pad_token_id)
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=True,
    )
    cache = output_cache(output)
    if shared and not hasattr(cache, "reorder_cache"):
        return _prefill_rows(model, prompts, pad_token_id)
    last_logits = output.logits[:, -1, :]
    if shared:
        index = torch.tensor(rows, dtype=torch.long)
        cache.reorder_cache(index)  # in place: row i of the cache becomes distinct row rows[i]
        last_logits = last_logits[index]
        batch = LeftPadded(
            input_ids=batch.input_ids[index],
            attention_mask=batch.attention_mask[index],
            position_ids=batch.position_ids[index],
        )
    return output, last_logits, batch


def _prefill_rows(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[Any, torch.Tensor, LeftPadded]:
    batch = left_pad(prompts, pad_token_id)
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=True,
    )
    return output, output.logits[:, -1, :], batch


def _draw(
    probs: torch.Tensor, generators: Sequence[torch.Generator], done: Sequence[bool]
) -> torch.Tensor:
    """One token per row, each from its own generator; done rows get token 0.

    Exactly ``torch.multinomial(probs[row], 1, generator=generators[row])`` for every
    row that is not done (the same tokens, the same generator states after): for one
    sample multinomial draws ``q ~ Exp(1)`` of the row's size from the generator and
    takes ``argmax(probs / q)``. Here only the draw is per row (one op, into a row of
    one buffer); the division and the argmax run once for the batch, and the checks
    multinomial makes on every call once per step.
    """
    _check_probabilities(probs)
    noise = torch.ones_like(probs)  # a done row's draw is left out: its token is 0 anyway
    for row, (generator, row_noise) in enumerate(zip(generators, noise.unbind(0), strict=True)):
        if not done[row]:
            row_noise.exponential_(1, generator=generator)
    chosen = (probs / noise).argmax(dim=-1)
    return chosen.masked_fill(torch.tensor(list(done), dtype=torch.bool), 0)


def _check_probabilities(probs: torch.Tensor) -> None:
    """The checks ``torch.multinomial`` makes, with its messages."""
    if not bool(((probs.max() < float("inf")) & (probs.min() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probs.sum(dim=-1) == 0).any().item()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
