"""The form 2 ledger segment writer (JSON; delta records of whole compact siblings).

rollvault writes form 3 since; this is kept for the tests that check form 2
segments still load (and what a form 2 sibling leaves out), writing exactly
what the form 2 writer wrote: a sibling as a JSON object without its empty
attempt fields, a receipt without its derived gate rollout id and without
staging keys equal to the attempt's (:mod:`rollvault.ledger.compact_siblings`
reads it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from rollvault.ledger.compact_siblings import CompactAttemptState
from rollvault.ledger.records import RolloutAttemptRecord, RolloutSiblingRecord
from rollvault.ledger.state_schema import GroupHeaderState

FORM_2: Final = 2
_ENCODER: Final = msgspec.json.Encoder(order="sorted")


class CompactAttempt(CompactAttemptState, omit_defaults=True):
    """An attempt as form 2 wrote it: :class:`CompactAttemptState`'s fields, the empty ones
    left out (a separate class only for ``omit_defaults``: the decoded one must name every
    field in its builtins form)."""


class CompactSibling(msgspec.Struct, kw_only=True):
    """A sibling as form 2 wrote it."""

    generation_index: int
    attempts: list[CompactAttempt]


class RecordOut(msgspec.Struct, array_like=True, frozen=True):
    """One form 2 record: ``[base, header, [[index, sibling], ...]]``, pieces encoded."""

    base: tuple[int, int] | None
    header: msgspec.Raw | None
    siblings: list[tuple[int, msgspec.Raw]]


class _SegmentOut(msgspec.Struct, frozen=True):
    ledger_segment_format: int
    bases: list[str]
    records: list[RecordOut]


def compact_sibling(group_id: str, sibling: RolloutSiblingRecord) -> CompactSibling:
    """The form 2 piece of a live sibling."""
    prefix = f"{group_id}_g{sibling.generation_index}_a"
    return CompactSibling(
        generation_index=sibling.generation_index,
        attempts=[_compact_attempt(prefix, attempt) for attempt in sibling.attempts],
    )


def _compact_attempt(prefix: str, attempt: RolloutAttemptRecord) -> CompactAttempt:
    hex_id = attempt.attempt_uuid.hex
    receipt = attempt.receipt
    if receipt is not None:
        gate_id = prefix + hex_id
        keys = attempt.staging_keys
        receipt = {
            name: value
            for name, value in receipt.items()
            if not (
                (name == "gate_rollout_id" and value == gate_id)
                or (name == "staging_keys" and value == keys)
            )
        }
    return CompactAttempt(
        attempt_uuid=hex_id,
        status=attempt.status,
        receipt=receipt,
        reward=attempt.reward,
        mask_sample=attempt.mask_sample,
        reward_checks=attempt.reward_checks,
        reward_log_context=attempt.reward_log_context,
        staging_keys=attempt.staging_keys,
        failure_reason=attempt.failure_reason,
        failure_kind=attempt.failure_kind,
        turn_keys=attempt.turn_keys,
        env_state_revision=attempt.env_state_revision,
    )


def encode_piece(piece: GroupHeaderState | CompactSibling) -> bytes:
    """The bytes of a header or sibling as a form 2 record embeds them."""
    return _ENCODER.encode(piece)


def encode_form_2_segment(bases: Sequence[str], records: Sequence[RecordOut]) -> bytes:
    """The bytes of a form 2 ledger segment."""
    return _ENCODER.encode(
        _SegmentOut(ledger_segment_format=FORM_2, bases=list(bases), records=list(records))
    )
