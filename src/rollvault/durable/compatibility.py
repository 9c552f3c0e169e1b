"""The run's compatibility identity: what must not change across a resume.

The identity is the run's config with *operational* paths removed (where
logs and checkpoints go, how often they are written, ports, cluster sizes,
worker counts) and the reward block projected to the keys that change a
reward. Everything else is semantic and fail-closed: a key nobody listed here
takes part in the fingerprint, so a new setting can only make resume stricter.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from rollvault.durable.config_paths import (
    ConfigPath,
    _drop_excluded_paths,
    canonical_config,
    canonical_json,
    format_dotpath,
    parse_pattern,
)
from rollvault.durable.errors import IncompatibleRunError

__all__ = [
    "BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION",
    "BootstrapCompatibilityIdentity",
    "IncompatibleRunError",
    "bootstrap_compatibility_identity",
    "config_as_now_read",
]

BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION: Final = 7

# The one list of operational paths, each with the reason it cannot change
# what the run computes. Pattern syntax: see rollvault.durable.config_paths.
_EXCLUDED_PATH_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "logging": "where logs go and whether progress is shown: observes the run, never steers it",
        "logger": "metrics backends and logging intervals: observe the run, never steer it",
        "**.log_dir": "where logs are written",
        "checkpointing.checkpoint_dir": "where checkpoints live; a moved run directory is the same run",
        "checkpointing.save_period": (
            "how often trainer checkpoints are written; a restore retrains the rolled-back "
            "groups in the same steps whatever the period"
        ),
        "checkpointing.keep_latest_k": (
            "how many older trainer checkpoints are kept; a resume uses the newest"
        ),
        "rollout_checkpointing.enabled": "whether rollout snapshots are written at all",
        "rollout_checkpointing.interval_s": "how often rollout snapshots are taken",
        "rollout_checkpointing.keep_latest_k": "how many older snapshots are kept as fallbacks",
        "rollout_checkpointing.max_consecutive_failures": (
            "how many failed snapshots in a row stop the run: when it stops, not what it computes"
        ),
        "rollout_checkpointing.force_fresh": "how this start treats an existing run directory",
        "rollout_checkpointing.journal": (
            "whether and how often seals are journaled: what a restore keeps, not what the "
            "run computes"
        ),
        "rollout_checkpointing.shutdown_grace_s": (
            "how long a preempted start may take to write its final snapshot: when the run "
            "stops, not what it computes"
        ),
        "**.restore_mode": "how this start resumes, not what the run computes",
        "dataplane": (
            "which store holds the token rows (embedded or TransferQueue) and how it is "
            "started: the rows and their snapshot files are the same"
        ),
        "gate.simulated.latency_per_token_s": "simulated generation speed: timing, not tokens",
        "grpo.max_num_steps": (
            "when the run stops, not what a step computes: a finished run can be extended"
        ),
        "grpo.max_num_epochs": (
            "when the run stops, not what an epoch computes: a finished run can be extended"
        ),
        "rollout.max_inflight_prompts": (
            "how many groups generate at once: throughput; every attempt is seeded by its "
            "identity, not by what runs beside it"
        ),
        "**.max_batch_size": "how many attempts a generation engine batches: throughput",
        "ray": "where Ray runs (a private local Ray or a cluster): placement, not computation",
        "gate.ray": (
            "how many generation actors there are and where Ray places them: throughput; "
            "every attempt is seeded by its identity, not by the actor that runs it"
        ),
        "trainer.placement": "whether the trainer runs in the controller or a Ray actor",
        "trainer.ray_num_cpus": "Ray resources of the trainer actor: placement",
        "trainer.ray_num_gpus": "Ray resources of the trainer actor: placement",
        "trainer.micro_batch_size": (
            "how many sequences a trainer forward pass holds (memory): the accumulated "
            "gradient is the whole batch's, up to float rounding"
        ),
        "model.build_default": (
            "whether a missing model directory is built; what was built is in model.files"
        ),
        "model.path": (
            "where the model's files are; the model's identity is the digest of those files "
            "(model.files), so a moved model is the same model and new weights are not"
        ),
        "dataset.path": (
            "where the dataset file is; its rows are compared one by one with those the "
            "bootstrap anchor recorded (dataset_identity.json), so a moved file is the same "
            "dataset and a changed row is refused, by row"
        ),
        "**.port": "network ports of servers and workers",
        "**.host": "network addresses of servers and workers",
        "cluster": "the machine layout the run happens to be placed on",
        "**.num_nodes": "machine count: changes speed, not results",
        "**.gpus_per_node": "accelerators per machine: changes speed, not results",
        "**.num_workers": "process and actor counts: change speed, not results",
        "gate.vllm.launch": "who runs the vLLM servers (the run or someone else): placement",
        "gate.vllm.num_servers": "how many vLLM servers generate: speed, not results",
        "gate.vllm.urls": "where the vLLM servers are: placement",
        "gate.vllm.python": "which Python starts the vLLM servers: placement",
        "gate.vllm.base_port": "network ports of the vLLM servers",
        "gate.vllm.gpu_memory_utilization": "memory the vLLM servers take: capacity",
        "gate.vllm.kv_cache_space_gb": "KV cache the vLLM servers take: capacity",
        "gate.vllm.weights_dir": "where weight versions are written for the servers to reload",
        "gate.vllm.keep_weight_versions": "how many old weight versions stay on disk",
        "gate.vllm.request_timeout_s": "when a hung request counts as an infra failure: timing",
        "gate.vllm.startup_timeout_s": "how long a starting server may take: timing",
        "gate.vllm.max_restarts": "when a dying server is given up: when the run stops",
        "gate.vllm.api_key_env": "which variable holds the servers' key: access, not results",
    }
)
_BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS: Final = frozenset(_EXCLUDED_PATH_REASONS)

# The config key of the reward settings, and the keys of it that change a
# finalized reward or advantage: the fields of the ledger's
# CaptureRewardSettings (which the recovery sidecar stores and restore
# compares) plus the controller's RewardConfig. Other keys of the block
# (display, debug dumps) are left out so they cannot refuse a resume before
# the sidecar's own comparison runs. A reward-changing key missing here would
# escape the fingerprint: add it here when adding it to the config.
_REWARD_CONFIG_KEY: Final = "reward"
_REWARD_SEMANTIC_KEYS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "overlong_penalty": "subtracted from the reward of an overlong response",
        "mask_overlong": "whether an overlong response is masked out of the loss instead",
        "max_response_tokens": "length from which a response counts as overlong",
        "format_penalty": "subtracted from the reward of a response that fails the format check",
        "mask_nonfinite_logprobs": "whether a response with non-finite logprobs is masked",
        "normalize_advantages_by_std": "whether group advantages are divided by the reward std",
        "advantage_epsilon": "added to the std before that division",
        "function": "the reward function that scores every response",
        "format_regex": "the pattern the regex_format reward function matches",
        "timeout_s": (
            "how long a reward call may take before its attempt fails and is retried: "
            "which responses are scored"
        ),
        "function_sha256": (
            "the digest of the reward function's source file (added by the run's identity): "
            "changed reward code is a changed reward"
        ),
    }
)

# Settings added after runs were written without them, each with the value that
# does what those runs did: resumed with that value, such a run computes what it
# would have computed. An anchor that lacks one of these keys is read as holding
# that value, so it resumes exactly when this run's value is the same, and the
# refusal otherwise names the value that resumes it ("old -> new"). A setting
# whose old behaviour no value reproduces is not listed, and so is refused as a
# key the anchor lacks. Add a key here when adding a semantic setting.
_LEGACY_VALUES: Final[Mapping[str, tuple[Any, str]]] = MappingProxyType(
    {
        "rollout.prefix_resume": (
            "off",
            "an attempt killed mid-turn was generated again from the start of its turn",
        ),
        "rollout.prefix_resume_tokens": (16, "used only when rollout.prefix_resume is not off"),
        "reward.timeout_s": (None, "a reward call had no time limit"),
    }
)

_MISSING: Final = object()
_MAX_VALUE_CHARS: Final = 60
# A key is secret when one of its words is one of these, or its last word is
# token or key (so api_key and hf_token are secret, max_tokens is not).
_SECRET_WORDS: Final = frozenset(
    {"password", "passwords", "passwd", "secret", "secrets", "apikey", "credential", "credentials"}
)
_SECRET_LAST_WORDS: Final = frozenset({"token", "key"})
# Keys that end in "key" and hold no secret: the names of fields of a dataset's rows.
_NOT_SECRET_PATHS: Final = frozenset(
    {("dataset", "prompt_key"), ("dataset", "answer_key"), ("dataset", "messages_key")}
)
_WORD_SPLIT_RE: Final = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


class BootstrapCompatibilityIdentity(msgspec.Struct, frozen=True):
    """Rollout-semantic inputs that must match a trainer-version-zero cut.

    ``config`` is the run's config without its operational paths;
    ``excluded_paths`` lists the patterns that were removed (sorted), so a
    change of that list changes the fingerprint too.
    """

    schema_version: int
    excluded_paths: tuple[str, ...]
    config: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data of the identity; a fresh copy, never aliasing ``config``."""
        return {
            "schema_version": self.schema_version,
            "excluded_paths": list(self.excluded_paths),
            "config": canonical_config(self.config),
        }

    def fingerprint(self) -> str:
        """Return the canonical digest stored in snapshot manifests.

        SHA-256 (hex) of the canonical JSON of ``to_dict()``: sorted keys, no
        whitespace, ASCII; the same on every machine and every run.
        """
        return hashlib.sha256(canonical_json(self.to_dict())).hexdigest()


def _excluded_path_patterns() -> tuple[ConfigPath, ...]:
    return tuple(
        parse_pattern(pattern) for pattern in sorted(_BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS)
    )


def _normalize_capture_reward_config(dumped: dict[str, Any]) -> None:
    """Replace capture reward config with the projection sidecar restore compares.

    Otherwise the bootstrap fingerprint would reject harmless reward-config
    extras before the sidecar's semantic comparison ever ran. Keeps only the
    keys of ``_REWARD_SEMANTIC_KEYS`` in ``dumped["reward"]``, in place; a
    missing or non-mapping reward block is left as it is (and compared whole).
    """
    reward = dumped.get(_REWARD_CONFIG_KEY)
    if isinstance(reward, Mapping):
        dumped[_REWARD_CONFIG_KEY] = {
            key: value for key, value in reward.items() if key in _REWARD_SEMANTIC_KEYS
        }


def bootstrap_compatibility_identity(config: Mapping[str, Any]) -> BootstrapCompatibilityIdentity:
    """Remove explicitly operational paths from the fail-closed run identity.

    ``config`` is the run's whole config as a nested mapping of JSON values;
    raises ``TypeError``/``ValueError`` naming the dotpath of a value JSON
    cannot hold. The input is not modified.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping, got {type(config).__name__}")
    dumped = canonical_config(config)
    _normalize_capture_reward_config(dumped)
    kept = _drop_excluded_paths(dumped, excluded_paths=_excluded_path_patterns())
    return BootstrapCompatibilityIdentity(
        schema_version=BOOTSTRAP_COMPATIBILITY_SCHEMA_VERSION,
        excluded_paths=tuple(sorted(_BOOTSTRAP_FINGERPRINT_EXCLUDED_PATHS)),
        config=kept,
    )


def config_as_now_read(
    stored: BootstrapCompatibilityIdentity, current: BootstrapCompatibilityIdentity
) -> dict[str, Any]:
    """``stored``'s config as ``current``'s rollvault version would have written it.

    Paths ``current`` treats as operational that ``stored`` did not are dropped
    (they were declared not to change what a run computes), and each setting
    of ``_LEGACY_VALUES`` that ``current`` has and ``stored`` lacks takes its
    legacy value. The anchor is compatible exactly when the result equals
    ``current``'s config; the differences between them are what to report.
    """
    config = canonical_config(stored.config)
    added = sorted(set(current.excluded_paths) - set(stored.excluded_paths))
    config = _drop_excluded_paths(config, excluded_paths=tuple(parse_pattern(p) for p in added))
    for dotpath, (value, _why) in _LEGACY_VALUES.items():
        path = dotpath.split(".")
        if _lookup(current.config, path) is _MISSING or _lookup(config, path) is not _MISSING:
            continue
        section = config
        for name in path[:-1]:
            child = section.setdefault(name, {})
            if not isinstance(child, dict):
                break  # the anchor holds a value where this version has a section
            section = child
        else:
            section[path[-1]] = value
    return config


def _lookup(config: Mapping[str, Any], path: list[str]) -> Any:
    value: Any = config
    for name in path:
        if not isinstance(value, Mapping) or name not in value:
            return _MISSING
        value = value[name]
    return value


def _looks_secret(path: ConfigPath) -> bool:
    if path in _NOT_SECRET_PATHS:
        return False
    for segment in path:
        if segment.startswith("["):
            continue
        words = [word.lower() for word in _WORD_SPLIT_RE.split(segment) if word]
        if any(word in _SECRET_WORDS for word in words):
            return True
        if words and words[-1] in _SECRET_LAST_WORDS:
            return True
    return False


def _format_changed_value(value: Any, *, redact: bool = False) -> str:
    """Format one redacted compatibility value without flooding an error.

    ``<missing>`` for an absent key, ``<redacted>`` for a secret, otherwise
    compact JSON shortened to about 60 characters with its full length noted.
    """
    if value is _MISSING:
        return "<missing>"
    if redact:
        return "<redacted>"
    try:
        text = canonical_json(value).decode("ascii")
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= _MAX_VALUE_CHARS:
        return text
    return f"{text[: _MAX_VALUE_CHARS - 3]}... ({len(text)} chars)"


def _same_leaf(checkpoint: Any, expected: Any) -> bool:
    # Compared as the fingerprint sees them, so 1, 1.0, true and -0.0 vs 0.0
    # are differences exactly when they change the fingerprint.
    try:
        return canonical_json(checkpoint) == canonical_json(expected)
    except (TypeError, ValueError):
        return bool(checkpoint == expected)


def _compatibility_differences(
    checkpoint: Any,
    expected: Any,
    *,
    path: tuple[str, ...] = (),
) -> list[str]:
    """Describe changed compatibility leaves using user-facing dotpaths.

    One line ``dotpath: checkpoint value -> this run's value`` per changed
    leaf, per added or removed key (``<missing>`` on the absent side) and per
    list element, as ``a.b[2]``. Empty exactly when both sides are equal.
    """
    if isinstance(checkpoint, Mapping) and isinstance(expected, Mapping):
        lines: list[str] = []
        for key in sorted(set(checkpoint) | set(expected), key=str):
            lines += _compatibility_differences(
                checkpoint.get(key, _MISSING), expected.get(key, _MISSING), path=(*path, str(key))
            )
        return lines
    if isinstance(checkpoint, list | tuple) and isinstance(expected, list | tuple):
        lines = []
        for index in range(max(len(checkpoint), len(expected))):
            old = checkpoint[index] if index < len(checkpoint) else _MISSING
            new = expected[index] if index < len(expected) else _MISSING
            lines += _compatibility_differences(old, new, path=(*path, f"[{index}]"))
        return lines
    if checkpoint is not _MISSING and expected is not _MISSING and _same_leaf(checkpoint, expected):
        return []
    redact = _looks_secret(path)
    old_text = _format_changed_value(checkpoint, redact=redact)
    new_text = _format_changed_value(expected, redact=redact)
    return [f"{format_dotpath(path)}: {old_text} -> {new_text}"]
