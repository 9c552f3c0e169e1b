"""The typed run config: one YAML file plus ``a.b.c=value`` overrides.

Every knob has a default, so an empty file (or none) is a complete config.
:func:`load_run_config` reads the YAML, applies the command-line overrides,
then validates strictly: an unknown key is an error naming its full dotpath
and the closest valid key, a wrong type names the dotpath and the expected
type, and cross-field rules name every field involved.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import yaml  # type: ignore[import-untyped]  # no stubs without types-PyYAML

from rollvault.ledger.statuses import RecoveryGranularity

__all__ = [
    "CheckpointingConfig",
    "ConfigError",
    "DatasetConfig",
    "DatasetKind",
    "GateConfig",
    "GateKind",
    "GrpoConfig",
    "LocalModelGateConfig",
    "LoggingConfig",
    "ModelConfig",
    "OnDroppedPrompt",
    "RecoveryGranularity",
    "RestoreMode",
    "RewardConfig",
    "RolloutCheckpointingConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplerConfig",
    "SamplerKind",
    "SimulatedGateConfig",
    "TrainerConfig",
    "TrainerKind",
    "WarmupConfig",
    "config_to_dict",
    "default_config_path",
    "load_run_config",
    "parse_override",
    "validate_run_config",
]

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
UnitFraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class ConfigError(ValueError):
    """The run config is invalid; the message names the offending dotpath(s)."""


class SamplerKind(enum.StrEnum):
    """Which staleness policy decides what the trainer may take."""

    IN_ORDER = "in_order"
    WINDOWED = "windowed"


class OnDroppedPrompt(enum.StrEnum):
    """What happens to a target step when one of its groups is permanently lost."""

    REPLACE = "replace"
    SHRINK = "shrink"


class GateKind(enum.StrEnum):
    """What executes an attempt."""

    SIMULATED = "simulated"
    LOCAL_MODEL = "local_model"


class DatasetKind(enum.StrEnum):
    """Where prompts come from."""

    SYNTHETIC = "synthetic"
    ADDITION = "addition"


class TrainerKind(enum.StrEnum):
    """What consumes each step's batch."""

    RECORDING = "recording"
    """Checks and records batches, trains nothing (tests, the simulated run)."""
    GRPO = "grpo"
    """Trains the model of ``model.path`` with the clipped GRPO surrogate."""


class RestoreMode(enum.StrEnum):
    """What a start does with an existing checkpoint directory."""

    LATEST = "latest"
    TRAINER_CHECKPOINT = "trainer_checkpoint"
    NONE = "none"


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every config section: strict, immutable, keyword-only."""


class GrpoConfig(_Section, frozen=True):
    """Shape of a GRPO step and when the run stops."""

    # Prompt groups the trainer consumes per optimizer step.
    num_prompts_per_step: PositiveInt = 8
    # Generations (siblings) per prompt group.
    num_generations_per_prompt: PositiveInt = 4
    # Stop after this many optimizer steps ...
    max_num_steps: PositiveInt = 200
    # ... or after this many passes over the dataset, whichever comes first.
    max_num_epochs: PositiveInt = 10


class SamplerConfig(_Section, frozen=True):
    """Dataloader order and the staleness policy."""

    # in_order stamps each admitted group with a target step; windowed does not.
    kind: SamplerKind = SamplerKind.IN_ORDER
    # in_order admits a group stamped S only while S <= trainer_version + this.
    max_lookahead_versions: NonNegativeInt = 1
    # windowed trains a group only if trainer_version - start_weight_version <= this.
    max_staleness_versions: NonNegativeInt = 1
    # Permute the dataset each epoch, seeded by (seed, epoch).
    shuffle: bool = True


class RolloutConfig(_Section, frozen=True):
    """Capacity, retries and the policy for permanently lost groups."""

    # In-flight semaphore: prompt groups being generated at once.
    max_inflight_prompts: PositiveInt = 16
    # Replay-capacity semaphore, in groups; must hold at least one full step.
    max_buffered_rollouts: PositiveInt = 32
    # sibling: reuse sealed siblings after a failure; prompt_group: redo the whole group.
    recovery_granularity: RecoveryGranularity = RecoveryGranularity.SIBLING
    # Infrastructure (transient) failures tolerated per sibling before the group is lost.
    max_sibling_retries: NonNegativeInt = 3
    # Data (permanent) failures tolerated per group before it is lost.
    max_group_retries: NonNegativeInt = 2
    # replace: a lost group is replaced by a spare prompt with the same target step;
    # shrink: its step trains on fewer groups (down to the floor below).
    on_dropped_prompt: OnDroppedPrompt = OnDroppedPrompt.REPLACE
    # Floor of a shrunk step, as a fraction of num_prompts_per_step (rounded up).
    min_step_batch_fraction: UnitFraction = 0.5
    # Size of the replacement reserve pulled ahead from the dataloader.
    num_spare_prompts: NonNegativeInt = 2


class RewardConfig(_Section, frozen=True):
    """Reward checks, penalties and advantage normalisation applied by the finalizer."""

    # Subtracted from the reward of a response that reaches max_response_tokens.
    overlong_penalty: NonNegativeFloat = 0.0
    # Mask (exclude from the loss) a response that reaches max_response_tokens.
    mask_overlong: bool = True
    # Responses of this many tokens or more count as overlong.
    max_response_tokens: PositiveInt = 256
    # Subtracted from the reward of a response whose format check failed.
    format_penalty: NonNegativeFloat = 0.0
    # Mask a response whose generation logprobs are not all finite.
    mask_nonfinite_logprobs: bool = True
    # Divide group-relative advantages by the group's reward std (plus epsilon).
    normalize_advantages_by_std: bool = True
    # Keeps the std division finite when every sibling got the same reward.
    advantage_epsilon: PositiveFloat = 1e-6


class SimulatedGateConfig(_Section, frozen=True):
    """The deterministic simulated gate used by tests and benchmarks."""

    # Token ids are drawn from [0, vocab_size); the synthetic dataset uses it too.
    vocab_size: Annotated[int, msgspec.Meta(ge=2)] = 512
    # Response lengths follow a lognormal around the median, clipped to [min, max].
    min_response_tokens: PositiveInt = 4
    median_response_tokens: PositiveInt = 32
    # Sigma of the lognormal: larger means a longer tail, like reasoning rollouts.
    tail_sigma: NonNegativeFloat = 1.0
    max_response_tokens: PositiveInt = 512
    # Simulated generation time per response token, in seconds.
    latency_per_token_s: NonNegativeFloat = 0.0
    # Probability that an attempt fails and may be retried (infrastructure failure).
    transient_failure_rate: Probability = 0.0
    # Probability that an attempt fails in a way retrying the same data will not fix.
    permanent_failure_rate: Probability = 0.0
    # Tests: SIGKILL the whole process when an attempt of this dataset index starts
    # (a poison prompt); null: never.
    crash_on_prompt_idx: NonNegativeInt | None = None


class LocalModelGateConfig(_Section, frozen=True):
    """The local model gate: generation in a worker process, plain temperature sampling."""

    # Logits are divided by this before sampling (no top-k, no top-p); the GRPO
    # trainer divides by it too when it recomputes logprobs.
    temperature: PositiveFloat = 1.0
    # A response that has not ended with eos after this many tokens is cut (overlong).
    max_new_tokens: PositiveInt = 8
    # At most this many waiting requests are generated together in one batch.
    max_batch_size: PositiveInt = 64


class GateConfig(_Section, frozen=True):
    """Which gate runs attempts, and its settings."""

    kind: GateKind = GateKind.SIMULATED
    simulated: SimulatedGateConfig = msgspec.field(default_factory=SimulatedGateConfig)
    local_model: LocalModelGateConfig = msgspec.field(default_factory=LocalModelGateConfig)


class ModelConfig(_Section, frozen=True):
    """The policy model: a local Hugging Face causal LM directory (never downloaded)."""

    # Directory holding config.json, model.safetensors and the tokenizer files.
    path: NonEmptyStr = "runs/default/model"
    # When the directory does not exist, build the default tiny Qwen2-style model
    # with its character tokenizer there (seeded by ``seed``).
    build_default: bool = True


class WarmupConfig(_Section, frozen=True):
    """Supervised warm-up on the task's answers before RL (part of the default recipe)."""

    # Optimizer steps of warm-up; 0 turns it off.
    steps: NonNegativeInt = 0
    # Prompt/answer pairs per warm-up step.
    batch_size: PositiveInt = 64
    learning_rate: PositiveFloat = 3e-3


class TrainerConfig(_Section, frozen=True):
    """Which trainer consumes the batches, and the GRPO optimisation settings."""

    kind: TrainerKind = TrainerKind.RECORDING
    # AdamW settings.
    learning_rate: PositiveFloat = 1e-4
    weight_decay: NonNegativeFloat = 0.0
    # The importance ratio against the generation logprobs is clipped to [1 - eps, 1 + eps].
    clip_epsilon: PositiveFloat = 0.2
    # Weight of the KL penalty to the frozen initial policy; 0 (the default) turns it off.
    kl_coef: NonNegativeFloat = 0.0
    # Gradients are clipped to this global norm.
    grad_clip: PositiveFloat = 1.0
    warmup: WarmupConfig = msgspec.field(default_factory=WarmupConfig)


class DatasetConfig(_Section, frozen=True):
    """The prompt dataset."""

    kind: DatasetKind = DatasetKind.SYNTHETIC
    # Prompts per epoch.
    num_prompts: PositiveInt = 256
    # Tokens per synthetic prompt.
    prompt_tokens: PositiveInt = 16


class LoggingConfig(_Section, frozen=True):
    """Where logs go and whether to show live progress."""

    # Holds train_log.jsonl and attempts.jsonl.
    log_dir: NonEmptyStr = "runs/default/logs"
    # Live progress display on the terminal.
    progress: bool = True
    # Also write metrics as TensorBoard events, when the tensorboard package is installed.
    tensorboard: bool = False


class CheckpointingConfig(_Section, frozen=True):
    """Durable trainer checkpoints."""

    # Root of trainer checkpoints, rollout snapshots and the bootstrap anchor.
    checkpoint_dir: NonEmptyStr = "runs/default/checkpoints"
    # A trainer checkpoint every this many optimizer steps.
    save_period: PositiveInt = 50


class RolloutCheckpointingConfig(_Section, frozen=True):
    """Rollout snapshots between trainer checkpoints, and restore."""

    # Write periodic rollout snapshots at all.
    enabled: bool = True
    # Seconds between snapshots (skipped when nothing changed).
    interval_s: PositiveFloat = 5.0
    # Committed snapshots kept per anchor; older ones are pruned.
    keep_latest_k: PositiveInt = 2
    # latest: newest compatible snapshot; trainer_checkpoint: regenerate everything
    # after the last trainer checkpoint (the baseline); none: start fresh.
    restore_mode: RestoreMode = RestoreMode.LATEST
    # With restore_mode=none, start fresh even if the directory holds a run.
    force_fresh: bool = False


class RunConfig(_Section, frozen=True):
    """The whole run config."""

    # Seeds the dataset, the epoch permutations and the simulated gate.
    seed: NonNegativeInt = 0
    grpo: GrpoConfig = msgspec.field(default_factory=GrpoConfig)
    sampler: SamplerConfig = msgspec.field(default_factory=SamplerConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    gate: GateConfig = msgspec.field(default_factory=GateConfig)
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    checkpointing: CheckpointingConfig = msgspec.field(default_factory=CheckpointingConfig)
    rollout_checkpointing: RolloutCheckpointingConfig = msgspec.field(
        default_factory=RolloutCheckpointingConfig
    )


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-6`` as a float (YAML 1.2), not a string."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_MSGSPEC_PATH = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_BAD_ENUM_VALUE = re.compile(r"^Invalid enum value '(?P<value>.*)'$", re.DOTALL)


def default_config_path() -> Path:
    """The packaged ``configs/default.yaml``, equal to the Struct defaults."""
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def load_run_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read ``path`` (YAML; ``None`` means all defaults), apply overrides, validate.

    Each override is ``dotted.key=value``; the value is parsed as a YAML scalar.
    Raises :class:`ConfigError` naming the dotpath of whatever is wrong.
    """
    data = _read_yaml(path) if path is not None else {}
    _check_keys(data, RunConfig, "", f"config file {path}")
    origins: dict[str, str] = {}
    for override in overrides:
        dotpath, value = parse_override(override)
        _apply_override(data, dotpath, value, override)
        origins[dotpath] = f"override {override!r}"
    config = _convert(data, origins, default_origin=f"config file {path}" if path else None)
    validate_run_config(config)
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b.c=value`` into the checked dotpath and the YAML-scalar value."""
    dotpath, sep, raw = text.partition("=")
    dotpath = dotpath.strip()
    if not sep or not dotpath:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    if any(not part for part in dotpath.split(".")):
        raise ConfigError(f"override {text!r}: empty segment in key {dotpath!r}")
    try:
        value = yaml.load(raw, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    if isinstance(value, dict | list):
        raise ConfigError(
            f"override {text!r}: value must be a scalar, got {type(value).__name__}; "
            "override one leaf key at a time"
        )
    _leaf_type(dotpath, f"override {text!r}")
    return dotpath, value


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """The config as plain builtins (enums as their values), e.g. for the run fingerprint."""
    result = msgspec.to_builtins(config)
    if not isinstance(result, dict):
        raise TypeError(f"config_to_dict expects a RunConfig, got {type(config).__name__}")
    return result


def validate_run_config(config: RunConfig) -> None:
    """Cross-field rules; raises :class:`ConfigError` naming every field involved."""
    problems = [
        *_capacity_problems(config),
        *_gate_problems(config.gate.simulated),
        *_kind_problems(config),
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
    """The local model gate and the GRPO trainer only make sense together, on text prompts."""
    problems = []
    local = config.gate.kind is GateKind.LOCAL_MODEL
    grpo = config.trainer.kind is TrainerKind.GRPO
    if local != grpo:
        problems.append(
            f"gate.kind={config.gate.kind.value} and trainer.kind={config.trainer.kind.value} "
            "do not fit: the grpo trainer trains the model the local_model gate generates with "
            "(use both, or simulated with recording)"
        )
    if local and config.dataset.kind is not DatasetKind.ADDITION:
        problems.append(
            f"gate.kind=local_model needs text prompts with a verifier, but "
            f"dataset.kind={config.dataset.kind.value} has none (use dataset.kind=addition)"
        )
    return problems


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping at the top level, got {type(data).__name__}"
        )
    return data


def _check_keys(
    data: Mapping[str, Any], cls: type[msgspec.Struct], prefix: str, source: str
) -> None:
    """Reject unknown keys anywhere in ``data``, naming the dotpath and a suggestion."""
    fields = _field_types(cls)
    for key, value in data.items():
        dotpath = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(str(key), prefix, list(fields), source))
        sub = _struct_type(fields[key])
        if sub is not None and isinstance(value, Mapping):
            _check_keys(value, sub, f"{dotpath}.", source)


def _apply_override(data: dict[str, Any], dotpath: str, value: Any, text: str) -> None:
    *parents, leaf = dotpath.split(".")
    node = data
    for depth, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            section = ".".join(parents[: depth + 1])
            raise ConfigError(
                f"override {text!r}: {section} must be a mapping, got {type(child).__name__}"
            )
        node = child
    node[leaf] = value


def _leaf_type(dotpath: str, source: str) -> Any:
    """The annotated type of a leaf dotpath; unknown or non-leaf paths are errors."""
    cls: type[msgspec.Struct] = RunConfig
    parts = dotpath.split(".")
    for depth, part in enumerate(parts):
        fields = _field_types(cls)
        prefix = "".join(f"{p}." for p in parts[:depth])
        if part not in fields:
            raise ConfigError(_unknown_key_message(part, prefix, list(fields), source))
        sub = _struct_type(fields[part])
        if depth == len(parts) - 1:
            if sub is not None:
                raise ConfigError(f"{source}: {dotpath} is a section; set one of its keys")
            return fields[part]
        if sub is None:
            raise ConfigError(f"{source}: {prefix}{part} is a value, not a section")
        cls = sub
    raise AssertionError("unreachable: a dotpath has at least one segment")


def _unknown_key_message(key: str, prefix: str, names: list[str], source: str) -> str:
    dotpath = f"{prefix}{key}"
    message = f"{source}: unknown config key {dotpath!r}"
    suggestion = _suggest(key, prefix, names)
    if suggestion is not None:
        message += f"; did you mean {suggestion!r}?"
    return message + f" (valid keys here: {', '.join(prefix + n for n in sorted(names))})"


def _suggest(key: str, prefix: str, names: list[str]) -> str | None:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return prefix + close[0]
    # Not close to anything here: maybe a key of another section (by leaf name).
    by_leaf_name: dict[str, str] = {}
    for path in _leaf_paths(RunConfig, ""):
        by_leaf_name.setdefault(path.rsplit(".", 1)[-1], path)
    close = difflib.get_close_matches(key, list(by_leaf_name), n=1, cutoff=0.8)
    return by_leaf_name[close[0]] if close else None


def _leaf_paths(cls: type[msgspec.Struct], prefix: str) -> list[str]:
    paths = []
    for name, annotation in _field_types(cls).items():
        sub = _struct_type(annotation)
        if sub is None:
            paths.append(prefix + name)
        else:
            paths.extend(_leaf_paths(sub, f"{prefix}{name}."))
    return paths


def _field_types(cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {field.name: field.type for field in msgspec.structs.fields(cls)}


def _struct_type(annotation: Any) -> type[msgspec.Struct] | None:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return None


def _convert(
    data: dict[str, Any], origins: Mapping[str, str], *, default_origin: str | None
) -> RunConfig:
    try:
        return msgspec.convert(data, type=RunConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe_validation_error(str(exc), origins, default_origin)) from exc


def _describe_validation_error(
    message: str, origins: Mapping[str, str], default_origin: str | None
) -> str:
    """Rewrite msgspec's ``... - at `$.a.b``` as ``a.b: ...`` plus origin and enum choices."""
    match = _MSGSPEC_PATH.match(message)
    if match is None:
        return f"invalid run config: {message}"
    dotpath = match["path"].lstrip(".") or "<top level>"
    described = f"invalid run config: {dotpath}: {match['what']}"
    origin = origins.get(dotpath, default_origin)
    if origin is not None:
        described += f" (from {origin})"
    enum_type = _enum_at(dotpath)
    if enum_type is not None:
        choices = [str(member.value) for member in enum_type]
        described += f" (expected one of: {', '.join(choices)})"
        bad = _BAD_ENUM_VALUE.match(match["what"])
        close = difflib.get_close_matches(bad["value"], choices, n=1) if bad else []
        if close:
            described += f"; did you mean {close[0]!r}?"
    return described


def _enum_at(dotpath: str) -> type[enum.Enum] | None:
    try:
        annotation = _leaf_type(dotpath, "<lookup>")
    except ConfigError:
        return None
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    return None
