"""The GRPO trainer: one AdamW step per batch of canonical rows.

It implements :class:`rollvault.controller.loop.trainer.Trainer`. Each step
recomputes the logprobs of every trainable sequence under the current policy
(left-padded, with the temperature, top-p and top-k the gate sampled with),
evaluates :func:`rollvault.training.grpo_loss.grpo_loss` against the
generation logprobs and the per-token advantages the finalizer published,
clips the gradient norm and applies AdamW. The step runs in a worker thread,
so the controller's event loop keeps dispatching and sealing rollouts
meanwhile.

With ``micro_batch_size`` the step's sequences go through the model (and the
KL reference) that many at a time, each micro-batch's gradient accumulating
into the parameters' ``.grad``; every micro-batch loss is normalized by the
whole step's token count, so the accumulated gradient is the whole batch's
(up to float rounding) and one optimizer step follows.

A masked sample (``sample_mask`` false) has an all-zero token mask and adds
nothing; an invalid sibling's row is empty and is skipped.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec
import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import TrainerConfig
from rollvault.controller.loop.trainer import TrainBatch, TrainBatchError, TrainerCheckpointError
from rollvault.dataplane.interface import train_key
from rollvault.dataplane.rows import RowView
from rollvault.gates.sampling import LeftPadded, left_pad
from rollvault.gates.weight_bytes import state_dict_bytes
from rollvault.training.grpo_loss import GrpoLossStats, grpo_loss, summed_stats
from rollvault.training.logprobs import left_pad_values, token_logprobs
from rollvault.training.policy_dirs import publish_policy
from rollvault.training.shared_prefix import (
    right_pad_suffixes,
    shared_prefix_batch,
    suffix_logprobs,
)
from rollvault.training.trainer_files import (
    MODEL_FILENAME,
    OPTIMIZER_FILENAME,
    REFERENCE_FILENAME,
    STATE_FILENAME,
    TRAINER_FILES_SCHEMA_VERSION,
    TrainerStateFile,
    read_optimizer,
    read_state_file,
    read_tensors,
    write_optimizer,
    write_state_file,
    write_tensors,
)

__all__ = ["GrpoSettings", "GrpoTrainer", "PackedSample", "StepSamples", "step_samples"]


class GrpoSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Optimisation settings of a :class:`GrpoTrainer`."""

    learning_rate: float
    weight_decay: float = 0.0
    clip_epsilon: float = 0.2
    kl_coef: float = 0.0
    grad_clip: float = 1.0
    temperature: float = 1.0
    """The gate's sampling temperature: logprobs are recomputed at the same one."""
    top_p: float = 1.0
    """The gate's nucleus mass: logprobs are recomputed under the same filter."""
    top_k: int = 0
    """The gate's top-k (0: off): logprobs are recomputed under the same filter."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward pass (None: the whole step's batch at once)."""

    @classmethod
    def from_config(
        cls,
        config: TrainerConfig,
        *,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> GrpoSettings:
        return cls(
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            clip_epsilon=config.clip_epsilon,
            kl_coef=config.kl_coef,
            grad_clip=config.grad_clip,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            micro_batch_size=config.micro_batch_size,
        )


_KERNEL_OPTIONS: Final = ("fused", "foreach")
"""The optimizer's options that choose its kernel, not its arithmetic."""


class _Sample(msgspec.Struct, frozen=True):
    input_ids: np.ndarray
    generation_logprobs: np.ndarray
    token_mask: np.ndarray
    advantages: np.ndarray


class GrpoTrainer:
    """Trains ``model`` in place with GRPO (see the module docstring)."""

    def __init__(
        self, model: PreTrainedModel, *, pad_token_id: int, settings: GrpoSettings
    ) -> None:
        self._model = model
        self._pad_token_id = pad_token_id
        self._settings = settings
        self._optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=settings.learning_rate,
            weight_decay=settings.weight_decay,
            # AdamW's fused kernel (CPU and CUDA, every float dtype): one call for all
            # parameters instead of about ten ops per parameter, ~2 ms of the recipe's
            # ~80 ms step. A loaded checkpoint keeps it (load_checkpoint).
            fused=True,
        )
        # The frozen reference is the policy as the trainer received it (after warm-up).
        self._reference = _frozen_copy(model) if settings.kl_coef > 0.0 else None
        # Steps run in a worker thread; saving and weight export must not interleave with one.
        self._lock = threading.Lock()
        self.steps_trained = 0

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @property
    def settings(self) -> GrpoSettings:
        return self._settings

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on ``batch``, run off the event loop."""
        return await asyncio.to_thread(self._locked_step, batch)

    def weights_for_gate(self) -> bytes:
        """The current policy weights, as safetensors bytes (what the gate's worker loads)."""
        with self._lock:
            # No step runs under the lock: the tensors are copied once, straight into the bytes.
            return state_dict_bytes(self._model.state_dict())

    def export_policy(
        self, path: Path, tokenizer: PreTrainedTokenizerBase, *, with_digests: bool = False
    ) -> Path:
        """Publish the current policy at ``path`` as a Hugging Face model directory.

        See :func:`rollvault.training.policy_dirs.publish_policy`; never while a step runs.
        """
        with self._lock:
            return publish_policy(path, self._model, tokenizer, with_digests=with_digests)

    def save_checkpoint(self, directory: Path) -> None:
        with self._lock:
            write_tensors(directory / MODEL_FILENAME, self._model.state_dict())
            if self._reference is not None:
                write_tensors(directory / REFERENCE_FILENAME, self._reference.state_dict())
            optimizer_state = self._optimizer.state_dict()
            write_optimizer(directory / OPTIMIZER_FILENAME, optimizer_state["state"])
            write_state_file(
                directory / STATE_FILENAME,
                TrainerStateFile(
                    schema_version=TRAINER_FILES_SCHEMA_VERSION,
                    steps_trained=self.steps_trained,
                    param_groups=msgspec.to_builtins(optimizer_state["param_groups"]),
                    has_reference=self._reference is not None,
                ),
            )

    def load_checkpoint(self, directory: Path) -> None:
        with self._lock:
            state = read_state_file(directory / STATE_FILENAME)
            if state.has_reference != (self._reference is not None):
                raise TrainerCheckpointError(
                    f"{directory}: checkpoint has_reference={state.has_reference} but this "
                    f"trainer's kl_coef is {self._settings.kl_coef}"
                )
            _load_weights(self._model, directory / MODEL_FILENAME)
            if self._reference is not None:
                _load_weights(self._reference, directory / REFERENCE_FILENAME)
            per_param, rng = read_optimizer(directory / OPTIMIZER_FILENAME)
            # The kernel choice is this trainer's, not the checkpoint's (one written before
            # the fused kernel names none): the state and the arithmetic are the same.
            kernel = {name: self._optimizer.defaults[name] for name in _KERNEL_OPTIONS}
            groups = [{**_tuples(group), **kernel} for group in state.param_groups]
            try:
                self._optimizer.load_state_dict({"state": per_param, "param_groups": groups})
            except (ValueError, KeyError) as exc:
                raise TrainerCheckpointError(
                    f"{directory}: optimizer state does not fit: {exc}"
                ) from exc
            torch.set_rng_state(rng)
            self.steps_trained = state.steps_trained

    # -- one step -----------------------------------------------------------------------

    def _locked_step(self, batch: TrainBatch) -> dict[str, float]:
        with self._lock:
            return self._step(batch)

    def _step(self, batch: TrainBatch) -> dict[str, float]:
        return self._train(step_samples(batch))

    def train_samples(self, step: StepSamples) -> dict[str, float]:
        """One optimizer step on samples :func:`step_samples` took from a batch (blocking)."""
        with self._lock:
            return self._train(step)

    def _train(self, step: StepSamples) -> dict[str, float]:
        samples = step.unpacked()
        metrics = dict(step.metrics)
        if samples:
            stats, grad_norm = self._optimize(samples)
            metrics.update(
                loss=stats.policy_loss + self._settings.kl_coef * stats.kl,
                policy_loss=stats.policy_loss,
                kl=stats.kl,
                clip_fraction=stats.clip_fraction,
                mean_ratio=stats.mean_ratio,
                grad_norm=grad_norm,
                response_tokens=float(stats.tokens),
            )
        self.steps_trained += 1
        return metrics

    def _optimize(self, samples: Sequence[_Sample]) -> tuple[GrpoLossStats, float]:
        token_count = int(sum(int(s.token_mask.sum()) for s in samples))
        trained = self._with_gradient(samples)
        self._optimizer.zero_grad(set_to_none=True)
        parts = []
        chunks = _micro_batches(trained, self._settings.micro_batch_size) if trained else []
        for chunk in chunks:
            for bucket in _length_buckets(chunk):
                loss, stats = self._micro_batch_loss(bucket, token_count)
                loss.backward()  # accumulates into .grad across micro-batches
                parts.append(stats)
        if not parts:
            # Every sample's gradient is zero: AdamW still steps (its moments decay), as
            # it did when those samples ran and gave exact zeros.
            for parameter in self._model.parameters():
                if parameter.requires_grad:
                    parameter.grad = torch.zeros_like(parameter)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self._model.parameters(), self._settings.grad_clip
        )
        self._optimizer.step()
        return _batch_stats(parts, token_count), float(grad_norm)

    def _with_gradient(self, samples: Sequence[_Sample]) -> Sequence[_Sample]:
        """The samples that move the weights.

        Without a KL term a sample whose advantages are all zero (every sibling of
        its group got the same reward) adds exactly zero to the loss and to the
        gradient, so it is not run through the model: in the addition recipe about
        a fifth of a step's rows. The step's gradient, loss and clip fraction are the
        same (up to float summation order); ``mean_ratio`` is over the trained tokens.
        """
        if self._settings.kl_coef > 0.0:
            return samples  # the KL penalty has a gradient on every token
        return [s for s in samples if s.advantages[s.token_mask > 0].any()]

    def _micro_batch_loss(
        self, samples: Sequence[_Sample], token_count: int
    ) -> tuple[torch.Tensor, GrpoLossStats]:
        """The loss of ``samples``, normalized by the whole step's ``token_count``."""
        shared = self._shared_prefix_loss(samples, token_count)
        if shared is not None:
            return shared
        settings = self._settings
        padded = left_pad([s.input_ids.tolist() for s in samples], self._pad_token_id)
        length = padded.input_ids.shape[1]
        generation = left_pad_values([s.generation_logprobs for s in samples], length)
        advantages = left_pad_values([s.advantages for s in samples], length)
        mask = left_pad_values([s.token_mask for s in samples], length)
        reference = None
        if self._reference is not None:
            with torch.no_grad():
                reference = self._logprobs(self._reference, padded)
        logprobs = self._logprobs(self._model, padded)
        return grpo_loss(
            logprobs,
            generation,
            advantages,
            mask,
            clip_epsilon=settings.clip_epsilon,
            reference_logprobs=reference,
            kl_coef=settings.kl_coef,
            token_count=token_count,
        )

    def _shared_prefix_loss(
        self, samples: Sequence[_Sample], token_count: int
    ) -> tuple[torch.Tensor, GrpoLossStats] | None:
        """The same loss, with each distinct prompt run once for the siblings sharing it
        (:mod:`rollvault.training.shared_prefix`); None when that saves nothing."""
        settings = self._settings
        starts = [int(np.argmax(s.token_mask > 0)) for s in samples]
        batch = shared_prefix_batch([s.input_ids for s in samples], starts, self._pad_token_id)
        if batch is None:
            return None
        sampling = {"temperature": settings.temperature, "top_p": settings.top_p}
        reference = None
        if self._reference is not None:
            with torch.no_grad():
                reference = suffix_logprobs(
                    self._reference, batch, top_k=settings.top_k, **sampling
                )
            if reference is None:
                return None
        logprobs = suffix_logprobs(self._model, batch, top_k=settings.top_k, **sampling)
        if logprobs is None:
            return None
        return grpo_loss(
            logprobs,
            right_pad_suffixes([s.generation_logprobs for s in samples], batch),
            right_pad_suffixes([s.advantages for s in samples], batch),
            right_pad_suffixes([s.token_mask for s in samples], batch),
            clip_epsilon=settings.clip_epsilon,
            reference_logprobs=reference,
            kl_coef=settings.kl_coef,
            token_count=token_count,
        )

    def _logprobs(self, model: PreTrainedModel, padded: LeftPadded) -> torch.Tensor:
        """Per-token logprobs under the gate's sampling distribution."""
        settings = self._settings
        return token_logprobs(
            model,
            padded,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
        )


class PackedSample(msgspec.Struct, frozen=True, array_like=True):
    """A :class:`_Sample`'s arrays as raw bytes (int64 ids, float32 values), cheap to send."""

    input_ids: bytes
    generation_logprobs: bytes
    token_mask: bytes
    advantages: bytes


class StepSamples(msgspec.Struct, frozen=True, kw_only=True):
    """What a step trains on, taken from its batch: the trainable samples, in batch order,
    and the metrics the rows give (reward, accuracy, groups, staleness).

    The trainer process (:mod:`rollvault.training.trainer_process`) receives this
    instead of the batch: the rows' other fields stay in the controller."""

    step: int
    metrics: dict[str, float]
    samples: list[PackedSample]

    def unpacked(self) -> list[_Sample]:
        return [
            _Sample(
                input_ids=np.frombuffer(s.input_ids, dtype=np.int64),
                generation_logprobs=np.frombuffer(s.generation_logprobs, dtype=np.float32),
                token_mask=np.frombuffer(s.token_mask, dtype=np.float32),
                advantages=np.frombuffer(s.advantages, dtype=np.float32),
            )
            for s in self.samples
        ]


def step_samples(batch: TrainBatch) -> StepSamples:
    """The trainable samples and the row metrics of ``batch`` (see :class:`StepSamples`)."""
    rows = _batch_rows(batch)
    samples = [s for s in (_sample(row) for row in rows) if s is not None]
    metrics = _reward_metrics(rows)
    metrics["groups"] = float(len(batch.groups))
    metrics["staleness"] = _mean([batch.step - e.start_weight_version for e in batch.groups])
    packed = [
        PackedSample(
            input_ids=s.input_ids.tobytes(),
            generation_logprobs=s.generation_logprobs.tobytes(),
            token_mask=s.token_mask.tobytes(),
            advantages=s.advantages.tobytes(),
        )
        for s in samples
    ]
    return StepSamples(step=batch.step, metrics=metrics, samples=packed)


def _reward_metrics(rows: Sequence[RowView]) -> dict[str, float]:
    """Mean reward of the unmasked rows, and ``accuracy``: the mean of their ``correct``.

    ``correct`` is the environment's verdict, which the gate staged and the
    finalizer copied into the canonical row. Rows without it (a reward
    function that does not say, a row staged by an older version) are left
    out of the accuracy; with none, the step has no ``accuracy``.
    """
    unmasked = [row for row in rows if bool(row["sample_mask"])]
    metrics = {
        "samples": float(len(rows)),
        "reward_mean": _mean([float(row["reward"]) for row in unmasked]),
    }
    verdicts = [float(bool(row["correct"])) for row in unmasked if "correct" in row]
    if verdicts:
        metrics["accuracy"] = _mean(verdicts)
    return metrics


def _batch_rows(batch: TrainBatch) -> list[RowView]:
    rows = []
    for entry in batch.groups:
        for index in range(batch.generations_per_group):
            key = train_key(entry.group_id, index)
            row = batch.rows.get(key)
            if row is None:
                raise TrainBatchError(f"step {batch.step}: batch lacks canonical row {key!r}")
            rows.append(row)
    return rows


def _sample(row: RowView) -> _Sample | None:
    """The row as a trainable sample, or None when it has no trainable token."""
    sample = _Sample(
        input_ids=np.asarray(row["input_ids"], dtype=np.int64),
        generation_logprobs=np.asarray(row["generation_logprobs"], dtype=np.float32),
        token_mask=np.asarray(row["token_mask"], dtype=np.float32),
        advantages=np.asarray(row["advantages"], dtype=np.float32),
    )
    lengths = {len(sample.input_ids), len(sample.generation_logprobs), len(sample.token_mask)}
    if len(lengths | {len(sample.advantages)}) != 1:
        raise TrainBatchError(f"canonical row has misaligned arrays (lengths {sorted(lengths)})")
    if len(sample.input_ids) < 2 or not sample.token_mask.any():
        return None
    return sample


def _batch_stats(parts: list[GrpoLossStats], token_count: int) -> GrpoLossStats:
    """The step's stats from its micro-batches' (each normalized by the step's
    ``token_count``), when only some samples ran: ``tokens`` is the step's count and
    ``mean_ratio`` the mean over the tokens that ran (1.0 when none did)."""
    if not parts:
        return GrpoLossStats(
            policy_loss=0.0, kl=0.0, clip_fraction=0.0, mean_ratio=1.0, tokens=token_count
        )
    summed = summed_stats(parts)
    ran = summed.tokens
    return msgspec.structs.replace(
        summed,
        mean_ratio=summed.mean_ratio * max(token_count, 1) / max(ran, 1),
        tokens=token_count,
    )


_PASS_COST_TOKENS = 128
"""What one more forward/backward pass costs, in padded token positions (its prompt pass
and its fixed per-op overhead; measured on the recipe's model): a split must save more."""


def _length_buckets(samples: Sequence[_Sample]) -> list[Sequence[_Sample]]:
    """``samples`` in one pass, or in two by the length of their trained part when that
    saves padding: the responses pass is right-padded to its longest response, and most
    responses end well before the longest (the recipe: 3-4 tokens of up to 6). The
    gradients of the passes add up to the one pass's (up to float rounding)."""
    if len(samples) < 2:
        return [samples]
    lengths = [len(s.input_ids) - int(np.argmax(s.token_mask > 0)) for s in samples]
    order = sorted(range(len(samples)), key=lengths.__getitem__)
    count, longest = len(order), lengths[order[-1]]
    best, split = count * longest, count
    for short in range(1, count):
        cost = short * lengths[order[short - 1]] + (count - short) * longest + _PASS_COST_TOKENS
        if cost < best:
            best, split = cost, short
    if split == count:
        return [samples]
    return [[samples[i] for i in order[:split]], [samples[i] for i in order[split:]]]


def _micro_batches(samples: Sequence[_Sample], size: int | None) -> list[Sequence[_Sample]]:
    """``samples`` in order, ``size`` at a time (None: all at once)."""
    if size is None or size >= len(samples):
        return [samples]
    return [samples[start : start + size] for start in range(0, len(samples), size)]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    reference = copy.deepcopy(model)
    reference.eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


def _load_weights(model: PreTrainedModel, path: Path) -> None:
    tensors = read_tensors(path)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise TrainerCheckpointError(f"{path} does not fit the model: {exc}") from exc


def _tuples(group: dict[str, object]) -> dict[str, object]:
    """JSON turned the optimizer's tuples (betas) into lists; turn them back."""
    return {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
