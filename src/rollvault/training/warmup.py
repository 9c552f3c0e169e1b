"""Supervised warm-up before RL: a few seconds of next-token training on the task's answers.

Part of the default recipe. A freshly initialised model almost never emits a
correct answer, so every sibling of a group scores the same, every advantage
is zero and GRPO has nothing to learn from. A short warm-up on
``prompt -> answer<eos>`` pairs teaches the format and a little arithmetic;
RL then improves accuracy from there. The loss covers the answer and eos
tokens only. Given the run's :class:`~rollvault.gates.prompt_rendering.PromptRenderer`,
the prompt is rendered exactly as the gate renders it (with
``model.chat_template``: through the chat template, system prompt included)
and the answer ends with the token generation stops at (the template's
end-of-turn token, else eos). It is deterministic given the seed: batches are drawn with a
private generator, and with one torch thread the arithmetic is too. A
restart before the first trainer checkpoint does not run it again: the recipe
saves the warmed-up policy as version 0 and the restart loads that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.gates.prompt_rendering import PROMPT_TEXT_KEY, PromptRenderer, PromptRenderError
from rollvault.gates.sampling import left_pad
from rollvault.training.logprobs import left_pad_values, token_logprobs

__all__ = ["WarmupObserver", "WarmupProgress", "WarmupReport", "supervised_warmup"]


class WarmupReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a warm-up did."""

    steps: int
    first_loss: float
    final_loss: float
    seconds: float


class WarmupProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Where a running warm-up is: reported before its first step and after each step."""

    steps_done: int
    steps: int
    loss: float | None
    """The last step's loss; None before the first step."""
    seconds: float
    """Since the first step started."""


WarmupObserver = Callable[[WarmupProgress], None]
"""Told of the warm-up's progress; it runs on the warm-up's thread, between steps."""


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    renderer: PromptRenderer | None = None,
    on_progress: WarmupObserver | None = None,
) -> WarmupReport:
    """Train ``model`` in place on ``(prompt_text, answer_text)`` pairs for ``steps`` steps.

    ``renderer``: how the gate renders prompts (None: ``prompt_text`` as it is, then eos).
    ``on_progress``: called once the examples are encoded, before the first step (a
    warm-up of many steps is otherwise silent for minutes), then after every step.
    """
    if not examples:
        raise ValueError("supervised_warmup: no examples")
    encoded = [
        _encode(tokenizer, renderer, index, prompt, answer)
        for index, (prompt, answer) in enumerate(examples)
    ]
    pad_id = int(tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    # Linear decay to zero: the last steps take small, low-noise updates.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, 1.0 - step / max(steps, 1))
    )
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    losses: list[float] = []

    def report() -> None:
        if on_progress is not None:
            loss = losses[-1] if losses else None
            seconds = time.perf_counter() - started
            on_progress(
                WarmupProgress(steps_done=len(losses), steps=steps, loss=loss, seconds=seconds)
            )

    model.train()
    try:
        report()
        for _ in range(steps):
            picks = torch.randint(len(encoded), (batch_size,), generator=generator).tolist()
            losses.append(_step(model, optimizer, [encoded[i] for i in picks], pad_id))
            schedule.step()
            report()
    finally:
        model.eval()
    return WarmupReport(
        steps=steps,
        first_loss=losses[0] if losses else float("nan"),
        final_loss=losses[-1] if losses else float("nan"),
        seconds=time.perf_counter() - started,
    )


def _encode(
    tokenizer: PreTrainedTokenizerBase,
    renderer: PromptRenderer | None,
    index: int,
    prompt: str,
    answer: str,
) -> tuple[list[int], list[float]]:
    """Token ids of ``prompt answer <end>`` and a 0/1 mask over the answer and its end."""
    if renderer is None:
        prompt_ids = list(tokenizer(prompt, add_special_tokens=False).input_ids)
        end = int(tokenizer.eos_token_id)
    else:
        try:
            prompt_ids = renderer.prompt_ids({PROMPT_TEXT_KEY: prompt})
        except PromptRenderError as error:
            raise ValueError(f"supervised_warmup: example {index}: {error}") from error
        end = renderer.answer_end_id
    answer_ids = [*tokenizer(answer, add_special_tokens=False).input_ids, end]
    return prompt_ids + answer_ids, [0.0] * len(prompt_ids) + [1.0] * len(answer_ids)


def _step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: list[tuple[list[int], list[float]]],
    pad_id: int,
) -> float:
    padded = left_pad([ids for ids, _ in batch], pad_id)
    mask = left_pad_values([np.asarray(m) for _, m in batch], padded.input_ids.shape[1])
    logprobs = token_logprobs(model, padded, temperature=1.0)
    loss = -(logprobs * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
