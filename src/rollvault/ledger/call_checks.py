"""Checks of ledger-call arguments that refer to a group's siblings or to the enums.

Each raises :class:`~rollvault.ledger.errors.InvalidLedgerInputError` naming
the group and what is wrong, before anything changes.
"""

from __future__ import annotations

from collections.abc import Collection

from rollvault.ledger.errors import InvalidLedgerInputError
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    RolloutSiblingRecord,
    SiblingSealResult,
)
from rollvault.ledger.statuses import RecoveryGranularity

_GRANULARITIES = frozenset(member.value for member in RecoveryGranularity)


def require_sibling(
    record: PromptGroupRecoveryRecord, generation_index: object
) -> RolloutSiblingRecord:
    """The sibling at ``generation_index`` (an int, not a bool, in range)."""
    if (
        isinstance(generation_index, bool)
        or not isinstance(generation_index, int)
        or not 0 <= generation_index < len(record.siblings)
    ):
        raise InvalidLedgerInputError(
            f"group {record.group_id!r}: generation_index {generation_index!r} is not a "
            f"sibling index (the group has {len(record.siblings)} siblings)"
        )
    return record.siblings[generation_index]


def distinct_indices(record: PromptGroupRecoveryRecord, generation_indices: object) -> list[int]:
    """A non-empty list of distinct, valid sibling indices."""
    if not isinstance(generation_indices, list | tuple) or not generation_indices:
        raise InvalidLedgerInputError(
            f"group {record.group_id!r}: generation_indices must be a non-empty list of "
            f"sibling indices or None, got {generation_indices!r}"
        )
    indices = [require_sibling(record, index).generation_index for index in generation_indices]
    if len(set(indices)) != len(indices):
        raise InvalidLedgerInputError(
            f"group {record.group_id!r}: generation_indices {generation_indices!r} repeats an index"
        )
    return indices


def check_complete_cohort(record: PromptGroupRecoveryRecord, results: object) -> None:
    """Exactly one :class:`SiblingSealResult` per sibling of the group."""
    if not isinstance(results, dict):
        raise InvalidLedgerInputError(
            f"group {record.group_id!r}: results must be a dict of generation index -> "
            f"SiblingSealResult, got {type(results).__name__}"
        )
    expected = set(range(len(record.siblings)))
    missing = sorted(expected - results.keys())
    extra = sorted(repr(key) for key in results.keys() - expected)
    if missing or extra:
        raise InvalidLedgerInputError(
            f"group {record.group_id!r}: mark_group_sealed needs exactly one result per "
            f"sibling 0..{len(record.siblings) - 1}; missing {missing}, unexpected {extra}"
        )
    for index, result in results.items():
        if not isinstance(result, SiblingSealResult):
            raise InvalidLedgerInputError(
                f"group {record.group_id!r} sibling {index}: expected a SiblingSealResult, "
                f"got {type(result).__name__}"
            )


def require_granularity(value: object, *, where: str) -> RecoveryGranularity:
    """A :class:`RecoveryGranularity`, given as the enum or its value."""
    if isinstance(value, str) and value in _GRANULARITIES:
        return RecoveryGranularity(value)
    allowed = ", ".join(repr(member.value) for member in RecoveryGranularity)
    raise InvalidLedgerInputError(
        f"{where}: recovery_granularity must be one of {allowed}, got {value!r}"
    )


def group_id_collection(group_ids: object, *, where: str) -> Collection[str]:
    """A collection (a set) of group id strings; a bare str is refused."""
    if isinstance(group_ids, str) or not isinstance(group_ids, Collection):
        raise InvalidLedgerInputError(
            f"{where}: group_ids must be a collection of group ids (a set), "
            f"got {type(group_ids).__name__}"
        )
    for group_id in group_ids:
        if not isinstance(group_id, str):
            raise InvalidLedgerInputError(
                f"{where}: every group id must be a str, got {group_id!r}"
            )
    return group_ids
