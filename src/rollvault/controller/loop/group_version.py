"""One weight version per ``prompt_group`` group.

``prompt_group`` granularity is for groups whose siblings must share one
weight version. A gate may still start a group's siblings on different
versions (a weight update lands between two of its batches, a restarted
worker loads newer weights), so the rollout pump checks each outcome before
sealing it: an attempt of a ``prompt_group`` group whose version differs from
that of a sibling already sealed is not sealed but failed as an
infrastructure failure, which redoes the whole group (the machinery split
it; the prompt did nothing wrong). ``sibling`` groups take any mix.

The version each sealed sibling was generated with is in its receipt
(``weight_version``), so the check holds across restores too. Receipts of
older versions do not carry it; such siblings are not compared.
"""

from __future__ import annotations

from typing import Any

from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.statuses import RecoveryGranularity, RolloutAttemptStatus


class ReceiptVersionError(ValueError):
    """A gate's receipt names another weight version than its outcome."""


def receipt_with_version(
    receipt: dict[str, Any], weight_version: int, *, gate_rollout_id: str
) -> dict[str, Any]:
    """``receipt`` with ``weight_version`` recorded (a gate may leave it out).

    Raises :class:`ReceiptVersionError` when the receipt names another version
    than the outcome: one of the two is wrong, and the ledger would keep it.
    """
    recorded = receipt.get("weight_version")
    if recorded is None:
        return {**receipt, "weight_version": weight_version}
    if recorded != weight_version:
        raise ReceiptVersionError(
            f"attempt {gate_rollout_id}: the receipt says weight_version {recorded!r}, "
            f"the outcome says {weight_version}"
        )
    return receipt


def sealed_versions(record: PromptGroupRecoveryRecord) -> dict[int, int]:
    """Generation index -> weight version, of the siblings sealed with a recorded one."""
    versions: dict[int, int] = {}
    for sibling in record.siblings:
        attempt = sibling.current_attempt
        if attempt.status is not RolloutAttemptStatus.SEALED or attempt.receipt is None:
            continue
        version = attempt.receipt.get("weight_version")
        if isinstance(version, int):
            versions[sibling.generation_index] = version
    return versions


def off_version_reason(record: PromptGroupRecoveryRecord, weight_version: int) -> str | None:
    """Why an attempt generated with ``weight_version`` may not seal in ``record``.

    None: it may (a ``sibling`` group, or no sealed sibling of another version).
    """
    if record.recovery_granularity is not RecoveryGranularity.PROMPT_GROUP:
        return None
    for index, version in sealed_versions(record).items():
        if version != weight_version:
            return (
                f"generated with weight version {weight_version}, but sibling {index} is "
                f"sealed with version {version}; a prompt_group group's siblings share one "
                "version, so the group is redone"
            )
    return None
