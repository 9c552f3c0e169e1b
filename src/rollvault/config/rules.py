"""Cross-field rules of the run config, checked after every field is valid on its own."""

from __future__ import annotations

import re

from rollvault.config.errors import ConfigError
from rollvault.config.schema import (
    FILE_DATASET_KINDS,
    DatasetConfig,
    GateKind,
    ModelConfig,
    RewardConfig,
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
        *_reward_function_problems(config),
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
    """A model gate (local_model, ray, vllm) and the GRPO trainer only make sense together."""
    problems = []
    model_gate = config.gate.kind in (GateKind.LOCAL_MODEL, GateKind.RAY, GateKind.VLLM)
    grpo = config.trainer.kind is TrainerKind.GRPO
    if model_gate != grpo:
        problems.append(
            f"gate.kind={config.gate.kind.value} and trainer.kind={config.trainer.kind.value} "
            "do not fit: the grpo trainer trains the model a model gate (local_model, ray, vllm) "
            "generates with (use both, or simulated with recording)"
        )
    vllm = config.gate.vllm
    if config.gate.kind is GateKind.VLLM and not vllm.launch and not vllm.urls:
        problems.append("gate.vllm.launch is false, so gate.vllm.urls must name the servers")
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


_REGEX_FORMAT = "regex_format"
"""The built-in reward function that reads ``reward.format_regex``."""


def _reward_function_problems(config: RunConfig) -> list[str]:
    """A reward function scores text, and ``regex_format`` needs a valid pattern."""
    reward = config.reward
    problems = []
    if reward.function is not None and config.gate.kind is GateKind.SIMULATED:
        problems.append(
            f"reward.function={reward.function!r} needs a gate that generates text "
            "(gate.kind=local_model): the simulated gate scores token ids with the task's "
            "token environment"
        )
    return problems + _format_regex_problems(reward)


def _format_regex_problems(reward: RewardConfig) -> list[str]:
    uses_regex = reward.function == _REGEX_FORMAT
    if reward.format_regex is None:
        if uses_regex:
            return [
                "reward.function=regex_format needs reward.format_regex, the pattern a "
                "response must match"
            ]
        return []
    if not uses_regex:
        return [
            f"reward.format_regex is set but reward.function is {reward.function!r}; only "
            "the regex_format built-in uses it (set reward.function=regex_format, or remove it)"
        ]
    try:
        re.compile(reward.format_regex)
    except re.error as error:
        return [f"reward.format_regex={reward.format_regex!r} is not a valid regex: {error}"]
    return []
