"""The compact form a form 2 ledger segment record stores a sibling in, read back.

A version 5 sibling (:class:`~rollvault.ledger.state_schema.SiblingState`)
names every field of every attempt, null or empty ones included, and a
sealed attempt's receipt repeats two things the ledger knows anyway: its
staging keys (the attempt's own ``staging_keys``) and its gate rollout id
(derived from group, sibling and attempt UUID, DESIGN.md). Here an attempt
leaves out every field at its empty value (null, ``[]``, 0: an unsealed
attempt is its UUID and status), and a receipt leaves out
``gate_rollout_id`` when it is the derived one and ``staging_keys`` when
they are the attempt's. Both are required receipt fields, so their absence
is unambiguous: :func:`expand_siblings` puts them back, and the expanded
sibling is the version 5 one exactly (then checked as every persisted group
is). A receipt whose values differ keeps them.

The decoded types are subclasses of the version 5 ones that only give the
optional fields their empty defaults: decoding stays in C, strict, and the
result *is* a version 5 state (``msgspec.to_builtins`` names every field).
Objects, not arrays: an array per attempt saves its field names but needs a
Python constructor per attempt on restore (measured 13% more read + verify
CPU at 16k attempts, against 2% this way).

This build writes form 4, form 3's packed pieces plus status and header
patches (:mod:`rollvault.ledger.packed_groups`), and only reads this form (the tests keep its writer, ``tests/support/ledger_form2.py``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.state_schema import AttemptState, SiblingState
from rollvault.ledger.statuses import AttemptFailureKind

_NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class CompactAttemptState(AttemptState, kw_only=True):
    """An :class:`AttemptState` decoded from its compact form (the empty fields defaulted).

    Every field but ``attempt_uuid`` and ``status`` must get its empty default
    here: a field added to :class:`AttemptState` and forgotten here would be
    required in the compact form (``test_ledger_compact_siblings`` checks).
    """

    receipt: dict[str, Any] | None = None
    reward: float | None = None
    mask_sample: bool | None = None
    reward_checks: RewardChecks | None = None
    reward_log_context: RewardLogContext | None = None
    staging_keys: list[str] = msgspec.field(default_factory=list)
    failure_reason: str | None = None
    failure_kind: AttemptFailureKind | None = None
    turn_keys: list[_NonEmptyStr] = msgspec.field(default_factory=list)
    env_state_revision: _NonNegativeInt = 0


class CompactSiblingState(SiblingState, kw_only=True):
    """A :class:`SiblingState` decoded from its compact form."""

    attempts: Annotated[list[CompactAttemptState], msgspec.Meta(min_length=1)]  # type: ignore[assignment]


def expand_siblings(group_id: str, siblings: list[CompactSiblingState]) -> None:
    """Put the derivable receipt fields back, in place (the siblings are freshly decoded)."""
    for sibling in siblings:
        prefix = None
        for attempt in sibling.attempts:
            receipt = attempt.receipt
            if receipt is None:
                continue
            if "gate_rollout_id" not in receipt:
                prefix = prefix or f"{group_id}_g{sibling.generation_index}_a"
                receipt["gate_rollout_id"] = prefix + attempt.attempt_uuid
            if "staging_keys" not in receipt:
                receipt["staging_keys"] = list(attempt.staging_keys)
