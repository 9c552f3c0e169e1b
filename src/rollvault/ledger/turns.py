"""Turn progress of multi-turn attempts: committing a turn, inheriting a prefix.

A turn (one model call and the observation after it) commits while its
attempt is ``dispatched``: its staging key is appended to the attempt's
``turn_keys`` and its ``env_state_revision`` advances. Committing is fenced
like a seal: only the sibling's current attempt may commit, so an attempt
superseded by a restart can never add a turn. After a restart, the fresh
attempt of a ``sibling``-granularity group starts with the interrupted
attempt's committed turns (its prefix); a ``prompt_group`` group is redone
whole, so its fresh attempts start empty. Callers hold the mutation cut.
"""

from __future__ import annotations

from rollvault.ledger.errors import InvalidLedgerInputError, LedgerTransitionError
from rollvault.ledger.records import PromptGroupRecoveryRecord, RolloutAttemptRecord
from rollvault.ledger.sealing import fenced_attempt
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus


def commit_turn(
    record: PromptGroupRecoveryRecord,
    generation_index: int,
    *,
    gate_rollout_id: str,
    staging_key: str,
    turn_index: int,
) -> RolloutAttemptRecord:
    """Append one committed turn to the current, dispatched attempt; return the attempt."""
    attempt = fenced_attempt(record, generation_index, gate_rollout_id)
    where = f"group {record.group_id!r} sibling {generation_index} attempt {attempt.attempt_id}"
    if record.status is not PromptGroupStatus.GENERATING:
        raise _refused(record, generation_index, attempt, f"group is {record.status.value!r}")
    if attempt.status is not RolloutAttemptStatus.DISPATCHED:
        raise _refused(record, generation_index, attempt, "only a dispatched attempt commits turns")
    if not isinstance(staging_key, str) or not staging_key:
        raise InvalidLedgerInputError(f"{where}: staging_key must be a non-empty str")
    if turn_index != len(attempt.turn_keys):
        raise InvalidLedgerInputError(
            f"{where}: turn {turn_index} committed after {len(attempt.turn_keys)} turns; "
            "turns commit in order, each once"
        )
    if staging_key in attempt.turn_keys:
        raise InvalidLedgerInputError(f"{where}: turn key {staging_key!r} is already committed")
    attempt.turn_keys.append(staging_key)
    attempt.env_state_revision += 1
    return attempt


def drop_turn_prefix(record: PromptGroupRecoveryRecord, generation_index: int) -> list[str]:
    """Forget the committed prefix of a reserved attempt (its episode restarts); return its keys."""
    attempt = record.siblings[generation_index].attempts[-1]
    if attempt.status is not RolloutAttemptStatus.RESERVED:
        raise _refused(
            record, generation_index, attempt, "only a reserved attempt restarts", "restart"
        )
    dropped, attempt.turn_keys = attempt.turn_keys, []
    attempt.env_state_revision = 0
    return dropped


def inherit_prefix(previous: RolloutAttemptRecord, fresh: RolloutAttemptRecord) -> None:
    """Give the fresh attempt of a restart the interrupted attempt's committed turns."""
    fresh.turn_keys = list(previous.turn_keys)
    fresh.env_state_revision = previous.env_state_revision


def check_receipt_prefix(
    record: PromptGroupRecoveryRecord,
    generation_index: int,
    attempt: RolloutAttemptRecord,
    staging_keys: list[str],
) -> None:
    """A seal's receipt must list the attempt's committed turns first, in order."""
    committed = attempt.turn_keys
    if committed and staging_keys[: len(committed)] != committed:
        raise InvalidLedgerInputError(
            f"group {record.group_id!r} sibling {generation_index} attempt "
            f"{attempt.attempt_id}: the receipt's staging_keys {staging_keys!r} do not start "
            f"with the attempt's committed turns {committed!r}"
        )


def _refused(
    record: PromptGroupRecoveryRecord,
    generation_index: int,
    attempt: RolloutAttemptRecord,
    why: str,
    transition: str = "commit turn",
) -> LedgerTransitionError:
    return LedgerTransitionError(
        f"group {record.group_id!r} sibling {generation_index}: {transition}: "
        f"attempt {attempt.attempt_id} ({attempt.status.value!r}): {why}",
        group_id=record.group_id,
        transition=transition,
        status=attempt.status.value,
        generation_index=generation_index,
        attempt_id=attempt.attempt_id,
    )
