"""Cross-field rules of the run config, checked after every field is valid on its own."""

from __future__ import annotations

from rollvault.config.errors import ConfigError
from rollvault.config.schema import (
    FILE_DATASET_KINDS,
    DatasetConfig,
    GateKind,
    ModelConfig,
    RunConfig,
    SimulatedGateConfig,
    TrainerKind,
)

__all__ = ["validate_run_config"]


def validate_run_config(config: RunConfig) -> None:
    """Cross-field rules; raises :class:`ConfigError` naming every field involved."""
    problems = [
        *_capacity_problems(config),
        *_gate_problems(config.gate.simulated),
        *_kind_problems(config),
        *_dataset_problems(config.dataset),
        *_model_problems(config.model),
        *_chat_problems(config),
    ]
    if problems:
        raise ConfigError("invalid run config:\n  " + "\n  ".join(problems))


def _capacity_problems(config: RunConfig) -> list[str]:
    buffered = config.rollout.max_buffered_rollouts
    per_step = config.grpo.num_prompts_per_step
    if buffered < per_step:
        return [
            f"rollout.max_buffered_rollouts ({buffered}) must be >= "
            f"grpo.num_prompts_per_step ({per_step}), or no step can ever fill"
        ]
    return []


def _gate_problems(gate: SimulatedGateConfig) -> list[str]:
    problems = []
    lengths = (gate.min_response_tokens, gate.median_response_tokens, gate.max_response_tokens)
    if not lengths[0] <= lengths[1] <= lengths[2]:
        problems.append(
            "gate.simulated.min_response_tokens ({}) <= gate.simulated.median_response_tokens "
            "({}) <= gate.simulated.max_response_tokens ({}) does not hold".format(*lengths)
        )
    failure = gate.transient_failure_rate + gate.permanent_failure_rate
    if failure > 1.0:
        problems.append(
            f"gate.simulated.transient_failure_rate + gate.simulated.permanent_failure_rate "
            f"({failure}) must be <= 1"
        )
    return problems


def _kind_problems(config: RunConfig) -> list[str]:
    """The local model gate and the GRPO trainer only make sense together."""
    problems = []
    local = config.gate.kind is GateKind.LOCAL_MODEL
    grpo = config.trainer.kind is TrainerKind.GRPO
    if local != grpo:
        problems.append(
            f"gate.kind={config.gate.kind.value} and trainer.kind={config.trainer.kind.value} "
            "do not fit: the grpo trainer trains the model the local_model gate generates with "
            "(use both, or simulated with recording)"
        )
    return problems


def _dataset_problems(dataset: DatasetConfig) -> list[str]:
    """A file dataset needs its file; a task that reads no file is given none."""
    kinds = " or ".join(sorted(FILE_DATASET_KINDS))
    if dataset.kind in FILE_DATASET_KINDS:
        if dataset.path is None:
            return [
                f"dataset.kind={dataset.kind} reads its rows from a file: set dataset.path "
                "to that file"
            ]
        return []
    return [
        f"dataset.{field}={value!r} is for file datasets (dataset.kind {kinds}); "
        f"dataset.kind={dataset.kind} reads no file (remove dataset.{field})"
        for field, value in (("path", dataset.path), ("messages_key", dataset.messages_key))
        if value is not None
    ]


def _model_problems(model: ModelConfig) -> list[str]:
    problems = []
    alphabet = model.default_alphabet
    repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if repeated:
        problems.append(
            f"model.default_alphabet repeats {repeated}: each character is one token, "
            "so each may appear once"
        )
    foreign = sorted({c for c in alphabet if not c.isascii()})
    if foreign:
        problems.append(
            f"model.default_alphabet holds characters that are not ASCII {foreign}: the "
            "default model's byte-level tokenizer has one token per ASCII character"
        )
    if model.system_prompt is not None and not model.chat_template:
        problems.append(
            "model.system_prompt is set but model.chat_template is false: only the chat "
            "template puts a system message in the prompt (set model.chat_template=true)"
        )
    return problems


def _chat_problems(config: RunConfig) -> list[str]:
    """Chat-format rows can only be rendered by a chat template."""
    if config.dataset.messages_key is not None and not config.model.chat_template:
        return [
            f"dataset.messages_key={config.dataset.messages_key!r} reads chat-format rows, "
            "which only a chat template can render: set model.chat_template=true"
        ]
    return []
