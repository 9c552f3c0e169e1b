"""The packed form a form 3 or 4 ledger segment stores a group in: its header and each attempt.

Form 3 and 4 records (:mod:`rollvault.ledger.ledger_records`) are msgpack, and
every piece of a group is an array whose positions are its fields, without
their names (form 2's JSON objects spent more bytes on field names than on
values):

- the header (:class:`PackedHeader`): the fields of
  :class:`~rollvault.ledger.state_schema.GroupHeaderState` in order, decoded
  by an ``array_like`` subclass of it, so every type and bound of the
  version 5 header holds as is;
- an attempt (:class:`PackedAttempt`): the fields of
  :class:`~rollvault.ledger.state_schema.AttemptState`, reordered so that
  the empty ones an attempt usually has come last, where the writer leaves
  them out (a reserved or dispatched attempt is its UUID and status). The
  UUID is its 16 raw bytes; reward checks and log context are arrays; the
  staging keys are their count when they are the derived ones
  (``"{gate rollout id}/{k}"``, what every gate writes: 10% of form 2's
  bytes); the receipt is a :class:`PackedReceipt`, without the two fields
  the ledger knows anyway (gate rollout id, staging keys) and with its row
  digests as raw bytes, whenever that gives back exactly the receipt (any
  other receipt is stored as its dict).

A piece does not depend on the record or segment around it, so the writer
compares attempts by the digest of their piece and a delta record holds only
the attempts that changed (:mod:`rollvault.controller.snapshots.ledger_segments`).

Reading: the pieces are decoded strictly in C (types, bounds, no unknown or
extra fields). A restore builds the ledger's records from them at once
(:func:`group_records`), and checks them as records
(:mod:`rollvault.ledger.checked_groups`); whoever asks for the persisted state
gets the version 5 :class:`~rollvault.ledger.state_schema.GroupState` from
:func:`group_state`. Both with plain constructors, not the decoded objects
themselves (an ``array_like`` struct's builtins are a list, and the parsed
sidecar hands the ledger out as builtins with field names), and not a C-level
``msgspec.convert(..., from_attributes=True)`` (27 ms for the 24.6k attempts
of 1,024 groups, against 10-15 ms for these constructors).
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec

from rollvault.ledger.receipts import copy_receipt
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.state_convert import group_header_to_state, group_to_state
from rollvault.ledger.state_schema import (
    GroupHeaderState,
    GroupState,
    PromptRefState,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RolloutAttemptStatus,
)
from rollvault.ledger.transitions import ALL_SEALED_STATUSES, RETRYABLE_ATTEMPT_STATUSES

_NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_UUID_BYTES: Final = 16

_SEALED: Final = RolloutAttemptStatus.SEALED
_FAILED: Final = RolloutAttemptStatus.FAILED
_SECOND: Final = operator.itemgetter(1)
_RETRYABLE: Final = RETRYABLE_ATTEMPT_STATUSES
_PRE_ADMISSION: Final = frozenset({RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.ABANDONED})
"""What ``state_checks`` allows before admission (nothing dispatched yet)."""

_ENCODER: Final = msgspec.msgpack.Encoder(order="sorted")
"""Deterministic: a receipt stored as a dict has its keys sorted (equal state, equal bytes)."""


class PackedPromptRef(PromptRefState, array_like=True):
    """A :class:`PromptRefState` as an array: ``[sample_id, task_name]``."""


class PackedHeader(GroupHeaderState, array_like=True):
    """A :class:`GroupHeaderState` as an array of its fields, in order."""

    prompt_ref: PackedPromptRef


class PackedReceipt(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A receipt's optional fields (None: absent), its derivable ones left out.

    Only written when it gives back the receipt exactly (:func:`_packed_receipt`):
    the gate rollout id is the derived one, the staging keys are the
    attempt's, every row digest is lowercase hex, no present field is null.
    """

    row_digests: list[tuple[_NonNegativeInt, bytes]] | None = None
    """Per staged row: (length, the digest's raw bytes)."""
    reward: float | None = None
    weight_version: _NonNegativeInt | None = None
    worker_id: _NonEmptyStr | None = None


class PackedAttempt(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """An attempt as written: ``AttemptState``'s fields, trailing empty ones left out."""

    attempt_uuid: Annotated[bytes, msgspec.Meta(min_length=_UUID_BYTES, max_length=_UUID_BYTES)]
    status: RolloutAttemptStatus
    reward: float | None = None
    mask_sample: bool | None = None
    receipt: PackedReceipt | dict[str, Any] | None = None
    reward_checks: tuple[bool, bool, bool] | None = None
    """``(overlong, format_ok, finite_logprobs)``."""
    reward_log_context: tuple[int, str] | None = None
    """``(response_length, stop_reason)``."""
    staging_keys: _NonNegativeInt | list[str] = 0
    """A count n: the derived keys ``"{gate rollout id}/{k}"`` for k < n; else the keys."""
    failure_reason: str | None = None
    failure_kind: AttemptFailureKind | None = None
    turn_keys: list[_NonEmptyStr] = msgspec.field(default_factory=list)
    env_state_revision: _NonNegativeInt = 0


_ATTEMPT_DEFAULTS: Final[tuple[object, ...]] = tuple(
    field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
    for field in msgspec.structs.fields(PackedAttempt)
)
_REQUIRED: Final = sum(1 for default in _ATTEMPT_DEFAULTS if default is msgspec.NODEFAULT)


def pack_header(record: PromptGroupRecoveryRecord) -> bytes:
    """The piece of ``record``'s header."""
    return _ENCODER.encode(group_header_to_state(record, PackedHeader, PackedPromptRef))


def pack_attempt(prefix: str, attempt: RolloutAttemptRecord) -> bytes:
    """The piece of ``attempt``; ``prefix`` is its sibling's ``"{group_id}_g{index}_a"``."""
    hex_id = attempt.attempt_uuid.hex
    gate_id = prefix + hex_id
    keys = attempt.staging_keys
    staging: int | list[str] = len(keys)
    if any(key != f"{gate_id}/{number}" for number, key in enumerate(keys)):
        staging = keys
    checks = attempt.reward_checks
    context = attempt.reward_log_context
    fields = [
        attempt.attempt_uuid.bytes,
        attempt.status,
        attempt.reward,
        attempt.mask_sample,
        _packed_receipt(attempt.receipt, gate_id, keys),
        None if checks is None else (checks.overlong, checks.format_ok, checks.finite_logprobs),
        None if context is None else (context.response_length, context.stop_reason),
        staging,
        attempt.failure_reason,
        attempt.failure_kind,
        attempt.turn_keys,
        attempt.env_state_revision,
    ]
    end = len(fields)
    while end > _REQUIRED and fields[end - 1] == _ATTEMPT_DEFAULTS[end - 1]:
        end -= 1
    return _ENCODER.encode(fields[:end])


def _packed_receipt(
    receipt: dict[str, Any] | None, gate_id: str, keys: list[str]
) -> PackedReceipt | dict[str, Any] | None:
    """The receipt packed if that gives it back exactly, else the receipt itself."""
    if receipt is None:
        return None
    if receipt.get("gate_rollout_id") != gate_id or receipt.get("staging_keys") != keys:
        return receipt
    if not receipt.keys() <= _RECEIPT_FIELDS or any(v is None for v in receipt.values()):
        return receipt
    rows = receipt.get("row_digests")
    reward = receipt.get("reward")
    version = receipt.get("weight_version")
    worker = receipt.get("worker_id")
    if (
        (reward is not None and type(reward) is not float)
        or (version is not None and (type(version) is not int or version < 0))
        or (worker is not None and (type(worker) is not str or not worker))
    ):
        return receipt
    packed_rows = None
    if rows is not None:
        if type(rows) is not list:
            return receipt
        packed_rows = []
        for row in rows:
            raw = _raw_digest(row)
            if raw is None:
                return receipt
            packed_rows.append((row["length"], raw))
    return PackedReceipt(
        row_digests=packed_rows, reward=reward, weight_version=version, worker_id=worker
    )


_RECEIPT_FIELDS: Final = frozenset(
    {"gate_rollout_id", "staging_keys", "row_digests", "reward", "weight_version", "worker_id"}
)


def _raw_digest(row: object) -> bytes | None:
    """A row digest entry's raw digest, if ``{"length": n, "digest": lowercase hex}`` exactly."""
    if type(row) is not dict or row.keys() != {"length", "digest"}:
        return None
    length, digest = row["length"], row["digest"]
    if type(length) is not int or length < 0 or type(digest) is not str:
        return None
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    return raw if raw.hex() == digest else None


@dataclass(frozen=True, slots=True)
class PackedGroup:
    """A group as its decoded pieces: the header and, per sibling 0..n-1 in order,
    ``(generation_index, attempts)``, each with at least one attempt (the resolver checks).

    Kept as read: :func:`group_records` and :func:`group_state` build what they
    return without sharing a mutable container with it, so it can be built from again.
    """

    header: PackedHeader
    siblings: list[tuple[int, list[PackedAttempt]]]


def group_records(groups: Sequence[PackedGroup]) -> list[PromptGroupRecoveryRecord]:
    """The live records (no runtime payload) of ``groups``, in order, straight from their
    pieces.

    What a restore loads: the same records ``group_state`` then
    :func:`~rollvault.ledger.state_load.records_from_checked_state` give, in one
    pass instead of two forms. Unchecked: the caller runs the state checks on them
    (:func:`~rollvault.ledger.state_checks.check_ledger_groups`) before anyone uses them,
    unless :func:`screened_group_records` cleared them.
    """
    records, _clean = screened_group_records(groups)
    return records


def screened_group_records(
    groups: Sequence[PackedGroup],
) -> tuple[list[PromptGroupRecoveryRecord], bool]:
    """:func:`group_records`, and whether every state check surely passes on them.

    The screen is one conservative pass over the pieces, made while the records are
    built (the checks on the built records cost a restore 18 ms of 16.5k attempts):
    True only when every rule of :mod:`~rollvault.ledger.state_checks` holds, by a
    cheaper test of the packed form (a packed receipt's gate rollout id and staging keys
    are the derived ones by construction, so only its counts, digests and reward are
    looked at). False says nothing is known: the caller runs the checks, which give the
    message. Every attempt's UUID object is built in one C-level call for all of them
    (a call per sibling cost 11 ms of 16k siblings, one call 1 ms).
    """
    raw = [
        attempt.attempt_uuid
        for group in groups
        for _index, attempts in group.siblings
        for attempt in attempts
    ]
    uuids = iter(msgspec.convert(raw, list[uuid.UUID]))
    doubts: list[str] = []
    records = [_group_record(group, uuids, doubts) for group in groups]
    clean = (
        not doubts
        and len(set(raw)) == len(raw)  # the checks' ledger-wide attempt UUIDs
        and len({group.header.group_id for group in groups}) == len(groups)
    )
    return records, clean


def _group_record(
    group: PackedGroup, uuids: Iterator[uuid.UUID], doubts: list[str]
) -> PromptGroupRecoveryRecord:
    """``group``'s record; ``uuids`` yields its attempts' UUIDs, in order; a group or
    attempt the screen cannot clear appends its group id to ``doubts``."""
    header = group.header
    group_id = header.group_id
    prompt_ref = header.prompt_ref
    before_admission = header.phase is PromptGroupPhase.RESERVED
    if not _header_clears(header, group.siblings, before_admission=before_admission):
        doubts.append(group_id)
    return PromptGroupRecoveryRecord(
        group_id=group_id,
        admission_id=header.admission_id,
        prompt_id=header.prompt_id,
        prompt_ref=PromptRef(sample_id=prompt_ref.sample_id, task_name=prompt_ref.task_name),
        task_source=header.task_source,
        recovery_granularity=header.recovery_granularity,
        runtime_prompt_payload=None,
        expected_generations=header.expected_generations,
        target_step=header.target_step,
        start_weight_version=header.start_weight_version,
        siblings=_sibling_records(group_id, group.siblings, uuids, doubts),
        phase=header.phase,
        status=header.status,
    )


def _header_clears(
    header: PackedHeader,
    siblings: list[tuple[int, list[PackedAttempt]]],
    *,
    before_admission: bool,
) -> bool:
    """The screen's group rules (``check_group_state``): the sibling count and indices,
    the superseded attempts' statuses, the phase's, and the status against the current
    attempts."""
    if len(siblings) != header.expected_generations:
        return False
    sealed = 0
    for position, (index, attempts) in enumerate(siblings):
        if index != position:
            return False
        if len(attempts) > 1 and any(attempt.status not in _RETRYABLE for attempt in attempts[:-1]):
            return False
        if before_admission and any(attempt.status not in _PRE_ADMISSION for attempt in attempts):
            return False
        if attempts[-1].status is _SEALED:
            sealed += 1
    status = header.status
    if status is PromptGroupStatus.GENERATING:
        return sealed < len(siblings)
    # Every other status is after admission and needs every current attempt sealed.
    return not before_admission and status in ALL_SEALED_STATUSES and sealed == len(siblings)


def _sibling_records(
    group_id: str,
    siblings: list[tuple[int, list[PackedAttempt]]],
    uuids: Iterator[uuid.UUID],
    doubts: list[str],
) -> list[RolloutSiblingRecord]:
    """The group's siblings as records, their attempts' UUIDs taken from ``uuids`` in
    order. Every container is new (the pieces stay as read): the keys, the turn keys,
    the receipt. An attempt the screen cannot clear (the attempt rules of
    ``state_checks``) appends its ``"{group_id}_g{index}_a"`` to ``doubts``. One call
    per group, plain loops (a call and a comprehension per sibling cost a restore
    ~16k of each); two calls per attempt, a screen and a build."""
    built = []
    for index, attempts in siblings:
        prefix = f"{group_id}_g{index}_a"
        records = []
        for attempt in attempts:
            if (
                attempt.staging_keys == 0
                and attempt.receipt is None
                and attempt.reward_checks is None
                and attempt.reward_log_context is None
            ):
                clears = _unsealed_clears(attempt)
                record = _unsealed_record(attempt, next(uuids))
            else:
                clears = _sealed_clears(attempt)
                record = _sealed_record(attempt, next(uuids), prefix + attempt.attempt_uuid.hex())
            if not clears:
                doubts.append(prefix)
            records.append(record)
        built.append(RolloutSiblingRecord(generation_index=index, attempts=records))
    return built


def _unsealed_clears(attempt: PackedAttempt) -> bool:
    """The screen of an attempt without a result (``_check_unsealed``): not sealed, no
    reward or mask, and the failure fields set exactly when it failed (a non-empty
    reason)."""
    status = attempt.status
    if status is _SEALED or attempt.reward is not None or attempt.mask_sample is not None:
        return False
    if status is _FAILED:
        return bool(attempt.failure_reason) and attempt.failure_kind is not None
    return attempt.failure_reason is None and attempt.failure_kind is None


def _sealed_clears(attempt: PackedAttempt) -> bool:
    """The screen of an attempt with a result (``_check_sealed``): sealed, a packed
    receipt (its id and keys derived, so right), at least one derived key, a row digest
    per key and none empty, a finite reward the receipt's equals, a mask, no failure
    fields."""
    receipt = attempt.receipt
    stored = attempt.staging_keys
    reward = attempt.reward
    return (
        attempt.status is _SEALED
        and type(receipt) is PackedReceipt
        and type(stored) is int
        and stored > 0
        and reward is not None
        and reward - reward == 0.0  # finite: inf - inf and nan are nan
        and attempt.mask_sample is not None
        and (receipt.reward is None or receipt.reward == reward)
        and attempt.failure_reason is None
        and attempt.failure_kind is None
        and (
            receipt.row_digests is None
            or (
                len(receipt.row_digests) == stored
                and all(map(_SECOND, receipt.row_digests))  # no digest empty
            )
        )
    )


def _unsealed_record(attempt: PackedAttempt, attempt_uuid: uuid.UUID) -> RolloutAttemptRecord:
    """The record of an attempt without a result (no receipt, keys, checks or context)."""
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=attempt.status,
        reward=attempt.reward,
        mask_sample=attempt.mask_sample,
        failure_reason=attempt.failure_reason,
        failure_kind=attempt.failure_kind,
        turn_keys=attempt.turn_keys[:],
        env_state_revision=attempt.env_state_revision,
    )


def _sealed_record(
    attempt: PackedAttempt, attempt_uuid: uuid.UUID, gate_id: str
) -> RolloutAttemptRecord:
    """The record of an attempt with a result; ``gate_id`` is its gate rollout id, from
    which the derived staging keys and a packed receipt's two left-out fields come."""
    stored = attempt.staging_keys
    if stored == 1:  # the derived key of a one-row attempt (most), no comprehension
        keys = [gate_id + "/0"]
    elif isinstance(stored, int):  # the derived keys
        keys = [f"{gate_id}/{number}" for number in range(stored)]
    else:
        keys = stored[:]
    receipt = attempt.receipt
    checks = attempt.reward_checks
    context = attempt.reward_log_context
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=attempt.status,
        receipt=(
            _receipt(receipt, gate_id, keys)
            if isinstance(receipt, PackedReceipt)
            else copy_receipt(receipt)
        ),
        reward=attempt.reward,
        mask_sample=attempt.mask_sample,
        reward_checks=None if checks is None else _reward_checks(checks),
        reward_log_context=(
            None
            if context is None
            else RewardLogContext(response_length=context[0], stop_reason=context[1])
        ),
        staging_keys=keys,
        failure_reason=attempt.failure_reason,
        failure_kind=attempt.failure_kind,
        turn_keys=attempt.turn_keys[:],
        env_state_revision=attempt.env_state_revision,
    )


def group_state(
    header: PackedHeader, siblings: list[tuple[int, list[PackedAttempt]]]
) -> GroupState:
    """The version 5 state of a group from its decoded pieces: ``siblings`` are
    ``(generation_index, attempts)``, each with at least one attempt (the caller checks).

    Built through the group's record (:func:`group_records`), whose containers are
    new, so the state shares nothing with the pieces. Not on a restore's path (it
    loads the records), so the second conversion costs nothing that is measured.
    """
    (record,) = group_records([PackedGroup(header, siblings)])
    return group_to_state(record)


def _receipt(packed: PackedReceipt, gate_id: str, keys: list[str]) -> dict[str, Any]:
    receipt: dict[str, Any] = {"gate_rollout_id": gate_id, "staging_keys": list(keys)}
    if packed.row_digests is not None:
        # A loop, not a comprehension (a function call each on CPython 3.11): most
        # receipts have one row, and a restore builds ~8k.
        digests = []
        for length, digest in packed.row_digests:
            digests.append({"length": length, "digest": digest.hex()})
        receipt["row_digests"] = digests
    if packed.reward is not None:
        receipt["reward"] = packed.reward
    if packed.weight_version is not None:
        receipt["weight_version"] = packed.weight_version
    if packed.worker_id is not None:
        receipt["worker_id"] = packed.worker_id
    return receipt


def _reward_checks(checks: tuple[bool, bool, bool]) -> RewardChecks:
    # Frozen, so one instance per combination is shared (8 at most): a dict
    # look-up instead of a constructor per sealed attempt.
    cached = _CHECKS.get(checks)
    if cached is None:
        overlong, format_ok, finite_logprobs = checks
        cached = _CHECKS[checks] = RewardChecks(
            overlong=overlong, format_ok=format_ok, finite_logprobs=finite_logprobs
        )
    return cached


_CHECKS: dict[tuple[bool, bool, bool], RewardChecks] = {}
