"""The versioned, persisted form of the ledger and of its sidecar envelope.

The schema is the set of msgspec Structs below; the ``_*_STATE_FIELDS``
frozensets are derived from them. Decoding is strict: an unknown field, a
missing field, a wrong type or an out-of-range number is rejected with the
JSON path of the offending value (for example
``$.groups[0].siblings[1].attempts[0].status``).

Version history: 3 is the first version rollvault writes (it starts at the
reference system's current version, whose fields it keeps); it adds
``failure_reason`` to attempts and stores attempt UUIDs as 32 hex digits.
4 adds ``failure_kind`` to attempts (``infra``, ``data`` or ``interrupted``;
set exactly when the attempt failed), so that retry budgets are counted from
the ledger across restarts. 5 adds the turn progress of multi-turn episodes
to attempts: ``turn_keys`` (the committed turns' staging keys) and
``env_state_revision``. Versions 3 and 4 are still read (their attempts
committed no turns). Version 3 is read: each attempt's kind is
inferred from its reason, which the controller prefixed with the kind
(:mod:`rollvault.ledger.state_upgrade`).

The sidecar *file* has a version 6 (:mod:`rollvault.ledger.indexed_sidecar`):
the ledger's groups are in ledger segments, each a version 5 ledger state,
and the file indexes them. The state itself (the reference API's
``state_dict``, ``build_rollout_recovery_state``, a parsed sidecar) stays
version 5: the schema above, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, TypeAlias, TypeVar

import msgspec

from rollvault.ledger.errors import LedgerStateError, UnsupportedSchemaVersionError
from rollvault.ledger.reward_penalties import (
    CaptureRewardSettings,
    RewardChecks,
    RewardLogContext,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

ROLLOUT_RECOVERY_SCHEMA_VERSION: Final = 5
SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS: Final = frozenset({3, 4, 5})

RolloutRecoveryState: TypeAlias = dict[str, Any]
"""A persisted state as JSON-safe builtins: the ledger part or the whole sidecar."""

_NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_AttemptHex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]


class _Schema(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every persisted struct: strict, keyword-only, every field required."""


class AttemptState(_Schema):
    attempt_uuid: _AttemptHex
    status: RolloutAttemptStatus
    receipt: dict[str, Any] | None
    """Checked against :class:`~rollvault.ledger.receipts.GateReceipt` on load."""
    reward: float | None
    mask_sample: bool | None
    reward_checks: RewardChecks | None
    reward_log_context: RewardLogContext | None
    staging_keys: list[str]
    failure_reason: str | None
    failure_kind: AttemptFailureKind | None
    turn_keys: list[_NonEmptyStr]
    env_state_revision: _NonNegativeInt


class SiblingState(_Schema):
    generation_index: _NonNegativeInt
    attempts: Annotated[list[AttemptState], msgspec.Meta(min_length=1)]


class PromptRefState(_Schema):
    sample_id: _NonEmptyStr
    task_name: str | None


class _GroupStart(_Schema):
    """The fields a group and its header share that come before ``siblings``.

    Two subclasses instead of one extending the other: a subclass's fields go
    after its base's, and a group's field order (``..., siblings, phase,
    status``) is the key order of its builtins form, which must not change.
    """

    group_id: _NonEmptyStr
    admission_id: _NonEmptyStr
    prompt_id: _NonEmptyStr
    prompt_ref: PromptRefState
    task_source: str | None
    recovery_granularity: RecoveryGranularity
    expected_generations: Annotated[int, msgspec.Meta(ge=1)]
    target_step: _NonNegativeInt | None
    start_weight_version: _NonNegativeInt


class GroupState(_GroupStart):
    siblings: list[SiblingState]
    phase: PromptGroupPhase
    status: PromptGroupStatus


class GroupHeaderState(_GroupStart):
    """A group's fields but its siblings: the header of a ledger segment record (sidecar v6)."""

    phase: PromptGroupPhase
    status: PromptGroupStatus


class LedgerState(_Schema):
    schema_version: int
    groups: list[GroupState]


class SidecarState(_Schema):
    schema_version: int
    ledger: LedgerState
    # The three maps below are checked by the sidecar's ``_validate_*`` helpers,
    # whose messages name the offending key (msgspec reports a map key as ``[...]``).
    batch_shortfall: dict[str, Any]
    """Target step (a decimal string: JSON keys are strings) -> groups permanently lost."""
    sampler_stamps_target_steps: bool | None
    finalizer_metrics_by_group: dict[str, Any]
    """Group id -> metric name -> finite number."""
    finalizer_rewards_by_group: dict[str, Any]
    """Group id -> one :class:`FinalizedReward` per sibling."""
    reward_settings: CaptureRewardSettings | None


def _fields(struct: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(struct.__struct_fields__)


_LEDGER_STATE_FIELDS: Final = _fields(LedgerState)
_SIDECAR_STATE_FIELDS: Final = _fields(SidecarState)
_GROUP_STATE_FIELDS: Final = _fields(GroupState)
_PROMPT_REF_STATE_FIELDS: Final = _fields(PromptRefState)
_SIBLING_STATE_FIELDS: Final = _fields(SiblingState)
_ATTEMPT_STATE_FIELDS: Final = _fields(AttemptState)


def _reject_unknown_fields(
    mapping: Mapping[Any, Any],
    *,
    expected: frozenset[str],
    context: str,
) -> None:
    """Reject fields that are not part of the current versioned schema.

    Names every unknown field at once (the strict decoder stops at the first).
    """
    unknown = [key for key in mapping if key not in expected]
    if unknown:
        names = ", ".join(sorted(repr(key) for key in unknown))
        raise LedgerStateError(
            f"{context}: unknown field(s) {names}; schema version "
            f"{ROLLOUT_RECOVERY_SCHEMA_VERSION} has exactly: {', '.join(sorted(expected))}"
        )


def check_schema_version(version: object, *, context: str) -> None:
    """Raise unless ``version`` is a schema version this build reads."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise LedgerStateError(
            f"{context}.schema_version: expected an int schema version, got {version!r}"
        )
    if version not in SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS:
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS))
        raise UnsupportedSchemaVersionError(
            f"{context}.schema_version: unsupported rollout recovery schema version "
            f"{version}; this build reads: {supported}"
        )


_S = TypeVar("_S", bound=msgspec.Struct)


def read_versioned(state: object, struct: type[_S], *, expected: frozenset[str], what: str) -> _S:
    """Strictly convert a versioned envelope (builtins) into ``struct``.

    Checks, in this order, so that each failure gets the most useful message:
    it is a mapping; its ``schema_version`` is supported (a newer writer may
    have other fields); it has no unknown top-level fields; then every field
    down to the leaves, by msgspec, with the JSON path of the first error.
    """
    if not isinstance(state, Mapping):
        raise LedgerStateError(f"{what} $: expected a dict, got {type(state).__name__}")
    if "schema_version" not in state:
        raise LedgerStateError(f"{what} $: missing required field 'schema_version'")
    check_schema_version(state["schema_version"], context=f"{what} $")
    _reject_unknown_fields(state, expected=expected, context=f"{what} $")
    try:
        return msgspec.convert(state, struct, strict=True)
    except msgspec.ValidationError as exc:
        raise LedgerStateError(f"{what}: {exc}") from exc
