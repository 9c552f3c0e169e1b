"""The ledger sidecar: the complete versioned recovery state of one snapshot.

The envelope holds the ledger's state and the controller state that must be
restored with it (per-step batch shortfall, whether the sampler stamps target
steps, per-group finalizer metrics and rewards, reward settings). It is
persisted as deterministic JSON bytes (sorted keys, msgspec), never pickle.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Protocol

import msgspec

from rollvault.ledger.checked_groups import CheckedGroups
from rollvault.ledger.errors import InvalidLedgerInputError, LedgerStateError
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.reward_penalties import CaptureRewardSettings, FinalizedReward
from rollvault.ledger.state_checks import check_ledger_state
from rollvault.ledger.state_load import records_from_checked_state
from rollvault.ledger.state_schema import (
    _SIDECAR_STATE_FIELDS,
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    GroupState,
    LedgerState,
    RolloutRecoveryState,
    SidecarState,
    _reject_unknown_fields,
    check_schema_version,
    read_versioned,
)
from rollvault.ledger.state_upgrade import upgrade_sidecar_state

ROLLOUT_RECOVERY_STATE_FILENAME: Final = "rollout_recovery.json"
"""Name of the sidecar file in a snapshot directory.

The reference system writes ``rollout_recovery.pt``, a torch pickle. Loading a
pickle runs whatever code it names, and loading a checkpoint must never run
code from it, so rollvault keeps the constant's name but writes JSON.
"""

_WHAT: Final = "rollout recovery sidecar"
_ENCODER: Final = msgspec.json.Encoder(order="sorted")


class ParsedRolloutRecoveryState(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """Validated controller and ledger state loaded from one checkpoint sidecar.

    Nothing in it aliases the state it was parsed from. The ledger part is in
    one of two checked forms: the typed state parsing checked (``checked_ledger``:
    a sidecar of version 5 or before, or a state made by hand), or, for a ledger
    read from ledger segments, the records a restore loads, checked as such
    (``checked_groups``, :mod:`rollvault.ledger.checked_groups`; then
    ``checked_ledger`` is None). Read it through :meth:`ledger_groups` and
    :meth:`take_records`. The reference API's builtins form, ``ledger_state``,
    is built when first asked for (``dict=True`` holds the cached value): a
    restore never reads it (~20 ms at 16k attempts).
    """

    checked_ledger: LedgerState | None
    """The ledger state parsing decoded and checked; shares nothing with anyone.
    None when the ledger is ``checked_groups``.

    :meth:`RolloutRecoveryLedger.load_parsed_state` builds the records from it
    without checking again, so only parsing makes it (a ledger state made by
    hand goes through ``load_state_dict``, which checks it). Replaced
    (``msgspec.structs.replace``), it is the ledger, whatever ``checked_groups`` holds.
    """
    batch_shortfall: dict[int, int]
    """Target step -> prompt groups permanently lost at that step."""
    sampler_stamps_target_steps: bool | None
    finalizer_metrics_by_group: dict[str, dict[str, float]]
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]]
    reward_settings: CaptureRewardSettings | None
    checked_groups: CheckedGroups | None = None
    """The ledger read from ledger segments, as checked records (when ``checked_ledger``
    is None). The struct is frozen but this object is not: its first ``take`` hands its
    built records over instead of copying them (16k attempts), and later calls build
    them again from the pieces, so what every call returns is equal and owned by the
    caller; only who built it changes."""

    def ledger_groups(self) -> Sequence[GroupState] | Sequence[PromptGroupRecoveryRecord]:
        """The ledger's groups in order, to read only: the typed states, or records."""
        if self.checked_ledger is not None:
            return self.checked_ledger.groups
        return self._checked_groups().view()

    def take_records(self) -> dict[str, PromptGroupRecoveryRecord]:
        """The ledger's groups as records for a ledger to own, by group id; each call
        gives records no one else holds."""
        if self.checked_ledger is not None:
            return records_from_checked_state(self.checked_ledger)
        return self._checked_groups().take()

    def _checked_groups(self) -> CheckedGroups:
        if self.checked_groups is None:
            raise LedgerStateError(f"{_WHAT}: a parsed state holds neither ledger form")
        return self.checked_groups

    @functools.cached_property
    def ledger_state(self) -> RolloutRecoveryState:
        """The ledger state as JSON-safe builtins, for :meth:`RolloutRecoveryLedger.from_state_dict`
        / ``load_state_dict``; equal to the ``ledger`` part of the sidecar it was parsed from
        (after any upgrade). A fresh copy per parsed state: changing it changes nothing else."""
        typed = self.checked_ledger
        if typed is None:
            typed = self._checked_groups().state()
        state: RolloutRecoveryState = msgspec.to_builtins(typed)
        return state


def _validate_batch_shortfall(value: object) -> dict[int, int]:
    """Return a defensive copy of per-step permanent rollout losses.

    Keys are target steps: ints, or canonical decimal strings (JSON object keys
    are strings). Values are non-negative group counts. Sorted by step.
    """
    if not isinstance(value, Mapping):
        raise LedgerStateError(
            f"batch_shortfall: expected a dict of step -> lost group count, got "
            f"{type(value).__name__}"
        )
    result: dict[int, int] = {}
    for key, count in value.items():
        step = _step_key(key)
        if step in result:
            raise LedgerStateError(f"batch_shortfall: step {step} appears more than once")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LedgerStateError(
                f"batch_shortfall[{key!r}]: expected a non-negative int group count, got {count!r}"
            )
        result[step] = count
    return dict(sorted(result.items()))


def _step_key(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, str) and key.isascii() and key.isdigit() and str(int(key)) == key:
        return int(key)
    raise LedgerStateError(
        f"batch_shortfall: key {key!r} is not a target step (a non-negative int, or its "
        "canonical decimal string)"
    )


def _validate_finalizer_metrics(value: object) -> dict[str, dict[str, float]]:
    """Copy checkpoint-owned per-group finalizer metrics (group id -> name -> finite number)."""
    if not isinstance(value, Mapping):
        raise LedgerStateError(
            f"finalizer_metrics_by_group: expected a dict, got {type(value).__name__}"
        )
    result: dict[str, dict[str, float]] = {}
    for group_id, metrics in value.items():
        where = f"finalizer_metrics_by_group[{group_id!r}]"
        if not isinstance(group_id, str) or not group_id:
            raise LedgerStateError(f"{where}: group ids must be non-empty str")
        if not isinstance(metrics, Mapping):
            raise LedgerStateError(f"{where}: expected a dict, got {type(metrics).__name__}")
        copied: dict[str, float] = {}
        for name, number in metrics.items():
            if not isinstance(name, str):
                raise LedgerStateError(f"{where}: metric names must be str, got {name!r}")
            if not _is_finite_number(number):  # the message is built only on failure
                _finite(number, where=f"{where}[{name!r}]")
            copied[name] = float(number)
        result[group_id] = copied
    return result


def _validate_finalizer_rewards(value: object) -> dict[str, list[FinalizedReward]]:
    """Validate per-group observations without retaining checkpoint aliases.

    Accepts ``FinalizedReward`` instances or their dicts; returns fresh lists.
    """
    if not isinstance(value, Mapping):
        raise LedgerStateError(
            f"finalizer_rewards_by_group: expected a dict, got {type(value).__name__}"
        )
    result: dict[str, list[FinalizedReward]] = {}
    for group_id, rewards in value.items():
        where = f"finalizer_rewards_by_group[{group_id!r}]"
        if not isinstance(group_id, str) or not group_id:
            raise LedgerStateError(f"{where}: group ids must be non-empty str")
        try:
            typed = msgspec.convert(
                msgspec.to_builtins(rewards), list[FinalizedReward], strict=True
            )
        except (msgspec.ValidationError, TypeError) as exc:
            raise LedgerStateError(f"{where}: {exc}") from exc
        for index, reward in enumerate(typed):
            # Checked per reward at every snapshot: build the message only on failure.
            if not (math.isfinite(reward.raw_reward) and math.isfinite(reward.reward)):
                _finite(reward.raw_reward, where=f"{where}[{index}].raw_reward")
                _finite(reward.reward, where=f"{where}[{index}].reward")
        result[group_id] = typed
    return result


def _validate_reward_settings(value: object) -> CaptureRewardSettings | None:
    if value is None or isinstance(value, CaptureRewardSettings):
        settings = value
    else:
        try:
            settings = msgspec.convert(value, CaptureRewardSettings, strict=True)
        except msgspec.ValidationError as exc:
            raise LedgerStateError(f"reward_settings: {exc}") from exc
    if settings is not None:
        _finite(settings.overlong_penalty, where="reward_settings.overlong_penalty")
        _finite(settings.format_penalty, where="reward_settings.format_penalty")
    return settings


def _is_finite_number(number: object) -> bool:
    return (
        not isinstance(number, bool) and isinstance(number, int | float) and math.isfinite(number)
    )


def _finite(number: object, *, where: str) -> float:
    if not _is_finite_number(number):
        raise LedgerStateError(f"{where}: expected a finite number, got {number!r}")
    return float(number)  # type: ignore[arg-type]  # an int or float, checked above


def build_rollout_recovery_state(
    ledger: RolloutRecoveryLedger,
    *,
    batch_shortfall: dict[int, int],
    sampler_stamps_target_steps: bool,
    finalizer_metrics_by_group: dict[str, dict[str, float]] | None = None,
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]] | None = None,
    reward_settings: CaptureRewardSettings | None = None,
    canonical_group_ids: set[str] | None = None,
) -> RolloutRecoveryState:
    """Build the complete versioned sidecar from ledger and controller state.

    Groups in ``canonical_group_ids`` (their canonical rows are already
    published) are left out of the ledger part. The result is JSON-safe
    builtins and shares nothing with its inputs. Call it inside the
    checkpoint section, after ``ledger.assert_checkpoint_safe()``.
    """
    if not isinstance(ledger, RolloutRecoveryLedger):
        raise InvalidLedgerInputError(
            f"build_rollout_recovery_state: expected a RolloutRecoveryLedger, got "
            f"{type(ledger).__name__}"
        )
    excluded = _canonical_ids(canonical_group_ids)
    envelope = build_sidecar_envelope(
        batch_shortfall=batch_shortfall,
        sampler_stamps_target_steps=sampler_stamps_target_steps,
        finalizer_metrics_by_group=finalizer_metrics_by_group,
        finalizer_rewards_by_group=finalizer_rewards_by_group,
        reward_settings=reward_settings,
    )
    state: RolloutRecoveryState = dict(
        envelope,
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        ledger=msgspec.to_builtins(ledger._ledger_state(exclude=excluded)),
    )
    return state


def build_sidecar_envelope(
    *,
    batch_shortfall: dict[int, int],
    sampler_stamps_target_steps: bool,
    finalizer_metrics_by_group: dict[str, dict[str, float]] | None = None,
    finalizer_rewards_by_group: dict[str, list[FinalizedReward]] | None = None,
    reward_settings: CaptureRewardSettings | None = None,
) -> RolloutRecoveryState:
    """Every field of the sidecar but its version and its ledger, validated, as builtins.

    Not in the reference API: the snapshot writer stores the ledger's records
    in segments (:mod:`rollvault.ledger.indexed_sidecar`) and this beside them.
    """
    if not isinstance(sampler_stamps_target_steps, bool):
        raise InvalidLedgerInputError(
            "build_rollout_recovery_state: sampler_stamps_target_steps must be a bool, got "
            f"{sampler_stamps_target_steps!r}"
        )
    envelope: RolloutRecoveryState = msgspec.to_builtins(
        {
            "batch_shortfall": {
                str(step): count
                for step, count in _validate_batch_shortfall(batch_shortfall).items()
            },
            "sampler_stamps_target_steps": sampler_stamps_target_steps,
            "finalizer_metrics_by_group": _validate_finalizer_metrics(
                finalizer_metrics_by_group or {}
            ),
            "finalizer_rewards_by_group": _validate_finalizer_rewards(
                finalizer_rewards_by_group or {}
            ),
            "reward_settings": _validate_reward_settings(reward_settings),
        }
    )
    return envelope


def sidecar_envelope_fields() -> frozenset[str]:
    """The fields :func:`build_sidecar_envelope` returns."""
    return _SIDECAR_STATE_FIELDS - {"schema_version", "ledger"}


def _canonical_ids(canonical_group_ids: object) -> frozenset[str]:
    if canonical_group_ids is None:
        return frozenset()
    if isinstance(canonical_group_ids, str) or not isinstance(canonical_group_ids, Collection):
        raise InvalidLedgerInputError(
            "build_rollout_recovery_state: canonical_group_ids must be a set of group ids, got "
            f"{type(canonical_group_ids).__name__}"
        )
    return frozenset(canonical_group_ids)


def parse_rollout_recovery_state(state: object) -> ParsedRolloutRecoveryState:
    """Validate and split a complete checkpoint sidecar by runtime owner.

    Strict: unknown, missing or mistyped fields, an unsupported schema version
    and every semantic rule of the ledger state are rejected with the JSON
    path of the offending value. A state of an older supported version is
    upgraded first (:mod:`rollvault.ledger.state_upgrade`). The result shares
    nothing with ``state``.
    """
    current = upgrade_sidecar_state(state)
    typed = read_versioned(current, SidecarState, expected=_SIDECAR_STATE_FIELDS, what=_WHAT)
    return _split(typed, from_bytes=False)


def split_sidecar(typed: SidecarState) -> ParsedRolloutRecoveryState:
    """Check a typed sidecar that shares nothing with anyone and split it by runtime owner.

    For a state assembled from freshly decoded parts (the indexed sidecar's
    segments): every check of :func:`parse_rollout_recovery_state` runs.
    """
    check_schema_version(typed.schema_version, context=_WHAT)
    return _split(typed, from_bytes=True)


def _split(typed: SidecarState, *, from_bytes: bool) -> ParsedRolloutRecoveryState:
    check_schema_version(typed.ledger.schema_version, context=f"{_WHAT} $.ledger")
    if typed.ledger.schema_version != typed.schema_version:
        raise LedgerStateError(
            f"{_WHAT} $.ledger.schema_version: {typed.ledger.schema_version} differs from the "
            f"envelope's schema version {typed.schema_version}"
        )
    check_ledger_state(typed.ledger, path="$.ledger")
    # Decoded from bytes, the typed state shares nothing with anyone. Converted
    # from a caller's builtins, its receipts are the caller's dicts: it is taken
    # again from fresh builtins instead (older versions and tests go here).
    checked = (
        typed.ledger
        if from_bytes
        else msgspec.convert(msgspec.to_builtins(typed.ledger), LedgerState)
    )
    return _parsed(typed, checked_ledger=checked)


class ControllerPart(Protocol):
    """The controller state a sidecar holds beside its ledger, as decoded (any version)."""

    @property
    def batch_shortfall(self) -> dict[str, Any]: ...
    @property
    def sampler_stamps_target_steps(self) -> bool | None: ...
    @property
    def finalizer_metrics_by_group(self) -> dict[str, Any]: ...
    @property
    def finalizer_rewards_by_group(self) -> dict[str, Any]: ...
    @property
    def reward_settings(self) -> CaptureRewardSettings | None: ...


def parsed_from_checked_groups(
    groups: CheckedGroups, controller: ControllerPart
) -> ParsedRolloutRecoveryState:
    """The parsed sidecar of a ledger read from segments (``groups``, checked) and the
    controller state beside it, checked as :func:`split_sidecar` checks it."""
    return _parsed(controller, checked_ledger=None, checked_groups=groups)


def _parsed(
    controller: ControllerPart,
    *,
    checked_ledger: LedgerState | None,
    checked_groups: CheckedGroups | None = None,
) -> ParsedRolloutRecoveryState:
    """The parsed state of a checked ledger (either form) and ``controller``, which this checks."""
    return ParsedRolloutRecoveryState(
        checked_ledger=checked_ledger,
        batch_shortfall=_validate_batch_shortfall(controller.batch_shortfall),
        sampler_stamps_target_steps=controller.sampler_stamps_target_steps,
        finalizer_metrics_by_group=_validate_finalizer_metrics(
            controller.finalizer_metrics_by_group
        ),
        finalizer_rewards_by_group=_validate_finalizer_rewards(
            controller.finalizer_rewards_by_group
        ),
        reward_settings=_validate_reward_settings(controller.reward_settings),
        checked_groups=checked_groups,
    )


def encode_rollout_recovery_state(state: RolloutRecoveryState) -> bytes:
    """Serialize a sidecar (from :func:`build_rollout_recovery_state`) to deterministic JSON.

    Object keys are sorted, so equal states give identical bytes. Only the
    envelope is checked here (a dict, a supported version, no unknown or
    missing top-level field): a state from ``build_rollout_recovery_state`` is
    valid by construction, and every rule is enforced where it protects a
    restore, when the bytes are decoded. Encoding is off the cut but holds
    the GIL, so it stays a single pass.
    """
    if not isinstance(state, Mapping):
        raise LedgerStateError(f"{_WHAT} $: expected a dict, got {type(state).__name__}")
    if "schema_version" not in state:
        raise LedgerStateError(f"{_WHAT} $: missing required field 'schema_version'")
    check_schema_version(state["schema_version"], context=f"{_WHAT} $")
    _reject_unknown_fields(state, expected=_SIDECAR_STATE_FIELDS, context=f"{_WHAT} $")
    missing = sorted(_SIDECAR_STATE_FIELDS - state.keys())
    if missing:
        raise LedgerStateError(f"{_WHAT} $: missing required field(s) {', '.join(missing)}")
    try:
        return _ENCODER.encode(state)
    except (TypeError, msgspec.EncodeError) as exc:
        raise LedgerStateError(f"{_WHAT}: not JSON-safe builtins: {exc}") from exc


def decode_rollout_recovery_state(data: bytes) -> ParsedRolloutRecoveryState:
    """Parse the bytes of a sidecar file; the same checks as :func:`parse_rollout_recovery_state`.

    Only data is read: no code from the file ever runs.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LedgerStateError(
            f"{ROLLOUT_RECOVERY_STATE_FILENAME}: expected bytes, got {type(data).__name__}"
        )
    try:
        typed = msgspec.json.decode(data, type=SidecarState, strict=True)
    except msgspec.ValidationError as exc:
        # Error path (or an older version): re-read untyped, so that an older
        # version is upgraded and any other problem gets exactly parse's
        # message (a newer schema version is reported as such, not as unknown
        # fields).
        return _parse_untyped(data, typed_error=exc)
    except msgspec.DecodeError as exc:
        raise LedgerStateError(
            f"{ROLLOUT_RECOVERY_STATE_FILENAME}: not valid JSON ({exc})"
        ) from exc
    if typed.schema_version != ROLLOUT_RECOVERY_SCHEMA_VERSION:
        return _parse_untyped(data, typed_error=None)
    try:
        return _split(typed, from_bytes=True)
    except LedgerStateError as exc:
        raise type(exc)(f"{ROLLOUT_RECOVERY_STATE_FILENAME}: {exc}") from exc


def _parse_untyped(
    data: bytes | bytearray | memoryview, *, typed_error: msgspec.ValidationError | None
) -> ParsedRolloutRecoveryState:
    state = msgspec.json.decode(data)
    try:
        parsed = parse_rollout_recovery_state(state)
    except LedgerStateError as exc:
        raise type(exc)(f"{ROLLOUT_RECOVERY_STATE_FILENAME}: {exc}") from exc
    current = isinstance(state, dict) and state.get("schema_version") == (
        ROLLOUT_RECOVERY_SCHEMA_VERSION
    )
    if typed_error is not None and current:
        # Parse accepted what the typed decoder refused: report the refusal.
        raise LedgerStateError(f"{ROLLOUT_RECOVERY_STATE_FILENAME}: {typed_error}") from typed_error
    return parsed
