"""The facts a fact segment holds, and the two forms a segment is stored in.

A fact is set once per prompt group and never changes: its *origin*
(:class:`OriginFact`), its *finalization* (:class:`FinalizedFact`) and,
since ``group_facts.json`` version 2, its *replay entry* (:class:`ReplayFact`:
which weights generated the canonical group and the step it waits for, what
``replay_buffer_metadata.json`` rewrote whole at every snapshot before its
version 3).

Two forms of segment are read; this build writes form 2:

- form 1 (``*.facts-segment.json``): strict JSON of :class:`FactSegment`, each
  fact an object tagged by ``kind``; origins and finalizations only. A
  finalization is mostly its 16 rewards as decimal text and its 16 gate
  rollout ids (~2.6 KB a group);
- form 2 (``*.facts-segment.msgpack``): msgpack ``[2, facts]``, each fact an
  array whose first element is its tag (1 origin, 2 finalization, 3 replay
  entry) and the rest its fields in order, without their names. A
  finalization (:class:`PackedFinalized`) keeps its rewards as raw
  little-endian float64 (exact: the same doubles come back), the rewards
  after penalties only when one differs from its raw reward, the masked
  siblings as their indices, and the gate rollout ids as each sibling's
  attempt UUID (16 raw bytes) whenever every id is the derived one,
  ``"{group_id}_g{index}_a{uuid hex}"`` (what the ledger mints; any other id
  list is stored as it is). About a fifth of form 1's bytes.

Decoding is strict in both forms (types, bounds, no unknown or missing
field); a form 2 fact's pieces must agree (as many rewards as attempts,
masked indices in range and once), or :class:`FactFormError` says which.
Format only: no I/O.
"""

from __future__ import annotations

import re
import struct
from typing import Annotated, Final

import msgspec

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.ledger.reward_penalties import FinalizedReward

FACT_SEGMENT_FORMAT: Final = 2
"""The form this build writes (form 1 is still read)."""
JSON_FACT_SEGMENT_FORMAT: Final = 1
FACT_SEGMENT_SUFFIX: Final = ".facts-segment.msgpack"
"""The file suffix of a form 2 segment, what this build writes."""
JSON_FACT_SEGMENT_SUFFIX: Final = ".facts-segment.json"
"""The file suffix of a form 1 segment."""
FACT_SEGMENT_SUFFIXES: Final = (FACT_SEGMENT_SUFFIX, JSON_FACT_SEGMENT_SUFFIX)

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_GroupId = Annotated[str, msgspec.Meta(min_length=1)]
_UUID_BYTES: Final = 16
_FLOAT_BYTES: Final = 8
_HEX_UUID: Final = re.compile(r"[0-9a-f]{32}")
_JSON_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_PACKED_ENCODER: Final = msgspec.msgpack.Encoder(order="sorted")


class FactFormError(ValueError):
    """A fact segment's bytes are not a valid segment of their form."""


class OriginFact(
    msgspec.Struct, tag="origin", tag_field="kind", forbid_unknown_fields=True, frozen=True
):
    """A group's origin, written when it is reserved."""

    group_id: _GroupId
    epoch: int
    dataset_idx: int
    prompt_identity: str | None
    """The dataset's identity digest of its prompt (None: not recorded)."""


class FinalizedFact(
    msgspec.Struct, tag="finalized", tag_field="kind", forbid_unknown_fields=True, frozen=True
):
    """What the finalizer recorded about a canonical group, written when it is finalized."""

    group_id: _GroupId
    rewards: list[FinalizedReward]
    metrics: dict[str, float]
    gate_rollout_ids: list[str]


class ReplayFact(msgspec.Struct, array_like=True, tag=3, forbid_unknown_fields=True, frozen=True):
    """A canonical group's replay entry (form 2 only): the fields of
    :class:`~rollvault.controller.data.replay_index.ReplayEntry`, in order, with its bounds."""

    group_id: _GroupId
    sample_id: Annotated[str, msgspec.Meta(min_length=1)]
    epoch: _NonNegativeInt
    start_weight_version: _NonNegativeInt
    end_weight_version: _NonNegativeInt
    target_step: _NonNegativeInt | None

    @classmethod
    def of(cls, entry: ReplayEntry) -> ReplayFact:
        return cls(
            entry.group_id,
            entry.sample_id,
            entry.epoch,
            entry.start_weight_version,
            entry.end_weight_version,
            entry.target_step,
        )

    def entry(self) -> ReplayEntry:
        return ReplayEntry(
            self.group_id,
            self.sample_id,
            self.epoch,
            self.start_weight_version,
            self.end_weight_version,
            self.target_step,
        )


Fact = OriginFact | FinalizedFact | ReplayFact


class FactSegment(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A form 1 fact segment: the facts one snapshot wrote, in ordinal order."""

    fact_segment_format: int
    facts: list[OriginFact | FinalizedFact]


class PackedOrigin(msgspec.Struct, array_like=True, tag=1, forbid_unknown_fields=True, frozen=True):
    """An :class:`OriginFact` in form 2."""

    group_id: _GroupId
    epoch: int
    dataset_idx: int
    prompt_identity: str | None


class PackedFinalized(
    msgspec.Struct, array_like=True, tag=2, forbid_unknown_fields=True, frozen=True
):
    """A :class:`FinalizedFact` in form 2 (see the module docstring)."""

    group_id: _GroupId
    raw_rewards: bytes
    """Per sibling its raw reward, little-endian float64."""
    rewards: bytes | None
    """Per sibling its reward after penalties, the same way; None: each equals its raw one."""
    masked: list[_NonNegativeInt]
    """The siblings that became masked rows, ascending."""
    metrics: dict[str, float]
    attempts: bytes | list[str]
    """Per sibling its attempt's 16 UUID bytes (the ids derived), or the gate rollout ids."""


class _PackedSegment(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    fact_segment_format: int
    facts: list[PackedOrigin | PackedFinalized | ReplayFact]


def encode_fact_segment(facts: list[Fact]) -> bytes:
    """The bytes of a form 2 segment holding ``facts`` in this order."""
    return _PACKED_ENCODER.encode(
        _PackedSegment(FACT_SEGMENT_FORMAT, [_packed(fact) for fact in facts])
    )


def encode_json_fact_segment(facts: list[OriginFact | FinalizedFact]) -> bytes:
    """The bytes of a form 1 segment (the writer before form 2; tests of older snapshots)."""
    return _JSON_ENCODER.encode(
        FactSegment(fact_segment_format=JSON_FACT_SEGMENT_FORMAT, facts=facts)
    )


def _packed(fact: Fact) -> PackedOrigin | PackedFinalized | ReplayFact:
    if isinstance(fact, OriginFact):
        return PackedOrigin(fact.group_id, fact.epoch, fact.dataset_idx, fact.prompt_identity)
    if isinstance(fact, ReplayFact):
        return fact
    raw = [reward.raw_reward for reward in fact.rewards]
    after = [reward.reward for reward in fact.rewards]
    return PackedFinalized(
        group_id=fact.group_id,
        raw_rewards=_doubles(raw),
        # Compared as bits: -0.0 == 0.0, yet it must come back as written.
        rewards=None if _doubles(after) == _doubles(raw) else _doubles(after),
        masked=[index for index, reward in enumerate(fact.rewards) if reward.masked],
        metrics=fact.metrics,
        attempts=_attempt_bytes(fact.group_id, fact.gate_rollout_ids),
    )


def _doubles(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def _attempt_bytes(group_id: str, ids: list[str]) -> bytes | list[str]:
    """The attempts' UUID bytes when every id is the derived one, else the ids."""
    out = bytearray()
    for index, gate_id in enumerate(ids):
        prefix = f"{group_id}_g{index}_a"
        hex_id = gate_id[len(prefix) :]
        if not gate_id.startswith(prefix) or not _HEX_UUID.fullmatch(hex_id):
            return list(ids)
        out += bytes.fromhex(hex_id)
    return bytes(out)


def decode_fact_segment(data: bytes, *, form: int) -> list[Fact]:
    """The facts of a segment of ``form`` (1 or 2), strictly decoded and checked.

    Raises :class:`FactFormError` (msgspec's message names the offending field).
    """
    try:
        if form == JSON_FACT_SEGMENT_FORMAT:
            segment = msgspec.json.decode(data, type=FactSegment, strict=True)
            _check_format(segment.fact_segment_format, form)
            return list(segment.facts)
        packed = msgspec.msgpack.decode(data, type=_PackedSegment, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FactFormError(str(exc)) from exc
    _check_format(packed.fact_segment_format, form)
    return [_unpacked(position, fact) for position, fact in enumerate(packed.facts)]


def _check_format(written: int, form: int) -> None:
    if written != form:
        raise FactFormError(
            f"unsupported fact_segment_format {written} (a file of its name holds form {form})"
        )


def _unpacked(position: int, fact: PackedOrigin | PackedFinalized | ReplayFact) -> Fact:
    if isinstance(fact, ReplayFact):
        return fact
    if isinstance(fact, PackedOrigin):
        return OriginFact(fact.group_id, fact.epoch, fact.dataset_idx, fact.prompt_identity)
    where = f"$.facts[{position}]"
    raw = _undoubled(fact.raw_rewards, f"{where}.raw_rewards")
    count = len(raw)
    after = raw if fact.rewards is None else _undoubled(fact.rewards, f"{where}.rewards")
    if len(after) != count:
        raise FactFormError(f"{where}.rewards: {len(after)} rewards for {count} raw rewards")
    masked = set(fact.masked)
    if sorted(masked) != fact.masked or (masked and max(masked) >= count):
        raise FactFormError(f"{where}.masked: not ascending sibling indices below {count}")
    return FinalizedFact(
        group_id=fact.group_id,
        rewards=[
            FinalizedReward(raw_reward=r, reward=a, masked=index in masked)
            for index, (r, a) in enumerate(zip(raw, after, strict=True))
        ],
        metrics=fact.metrics,
        gate_rollout_ids=_gate_ids(fact.group_id, fact.attempts, count, f"{where}.attempts"),
    )


def _undoubled(data: bytes, where: str) -> list[float]:
    if len(data) % _FLOAT_BYTES:
        raise FactFormError(f"{where}: {len(data)} bytes, not a whole number of float64s")
    return list(struct.unpack(f"<{len(data) // _FLOAT_BYTES}d", data))


def _gate_ids(group_id: str, attempts: bytes | list[str], count: int, where: str) -> list[str]:
    if isinstance(attempts, list):
        ids = attempts
    else:
        if len(attempts) % _UUID_BYTES:
            raise FactFormError(f"{where}: {len(attempts)} bytes, not a whole number of UUIDs")
        ids = [
            f"{group_id}_g{index}_a{attempts[start : start + _UUID_BYTES].hex()}"
            for index, start in enumerate(range(0, len(attempts), _UUID_BYTES))
        ]
    if len(ids) != count:
        raise FactFormError(f"{where}: {len(ids)} attempts for {count} rewards")
    return ids
