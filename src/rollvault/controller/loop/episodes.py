"""The environment state of in-flight episodes, per sibling, at its last committed turn.

The ledger records which turns an attempt committed (their staging keys and
an environment-state revision); this table holds what the ledger must not
(it is control-plane metadata only): each in-flight episode's per-turn
rewards and, for a ``restorable`` environment, the state it exported after
its last committed turn. Both change in the same mutation section as the
ledger's ``commit_turn`` (:class:`~rollvault.controller.loop.turn_commits.TurnCommitter`), so a snapshot sees them
agree. A snapshot writes the table as the ``env_rollouts.json`` sidecar
("the environment's rollouts" of the restore spec); restore gives each
continued attempt its entry (:meth:`EpisodeTable.resume_for`).

Entries are keyed by logical rollout id (``"{group_id}_g{index}"``): a
restored episode continues under a new attempt of the same sibling.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rollvault.controller.loop.gate import EpisodeResume
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import RolloutAttemptRecord
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.episodes import RestoreClass

__all__ = ["EpisodeState", "EpisodeTable", "logical_id", "owned_entries"]


class EpisodeState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One in-flight episode at its last committed turn (persisted in ``env_rollouts.json``)."""

    gate_rollout_id: str
    """The attempt that committed the latest turn."""
    restore_class: RestoreClass
    turn_rewards: list[float]
    """One reward per committed turn, in order."""
    env_state: dict[str, Any] | None
    """The environment's exported state (restorable environments), JSON builtins."""
    env_state_revision: int
    """Equals the ledger attempt's ``env_state_revision`` it belongs with."""


def logical_id(group_id: str, generation_index: int) -> str:
    """The sibling's logical rollout id, the table's key."""
    return f"{group_id}_g{generation_index}"


class EpisodeTable:
    """Episode states by logical rollout id (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[str, EpisodeState] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> EpisodeState | None:
        """The entry of sibling ``key`` (a logical rollout id), if any."""
        return self._entries.get(key)

    def record(self, key: str, state: EpisodeState) -> None:
        """Set the entry of ``key`` (inside the cut)."""
        self._entries[key] = state

    def forget(self, key: str) -> None:
        """Drop the entry of ``key``, if any (inside the cut)."""
        self._entries.pop(key, None)

    def capture(self) -> dict[str, EpisodeState]:
        """A copy of the entries (inside the cut; the entries themselves are frozen)."""
        return dict(self._entries)

    def load(self, entries: dict[str, EpisodeState]) -> None:
        """Replace the table with a snapshot's entries (restore, inside the cut)."""
        self._entries = dict(entries)

    def resume_for(
        self, key: str, attempt: RolloutAttemptRecord
    ) -> tuple[EpisodeResume | None, str | None]:
        """How the attempt continues its episode, or why it must restart.

        Returns ``(resume, None)`` for an attempt with a usable committed
        prefix, ``(None, None)`` for one without a prefix, and
        ``(None, reason)`` when the prefix cannot be continued.
        """
        if not attempt.turn_keys:
            return None, None
        entry = self._entries.get(key)
        if entry is None:
            return None, "its environment state is not in the snapshot"
        if entry.env_state_revision != attempt.env_state_revision:
            return None, (
                f"its environment state is at revision {entry.env_state_revision}, the "
                f"ledger's committed turns at {attempt.env_state_revision}"
            )
        if entry.restore_class is RestoreClass.RESTART_ONLY:
            return None, "its environment is restart_only"
        return (
            EpisodeResume(
                turn_keys=list(attempt.turn_keys),
                turn_rewards=list(entry.turn_rewards),
                restore_class=entry.restore_class,
                env_state=entry.env_state,
                env_state_revision=entry.env_state_revision,
            ),
            None,
        )


def owned_entries(
    entries: dict[str, EpisodeState], ledger: RolloutRecoveryLedger
) -> dict[str, EpisodeState]:
    """The entries whose sibling's current attempt is live with committed turns at their revision.

    What a snapshot writes: a finished, dropped or failed episode's entry
    (which the pump forgets, but a race with a snapshot may leave) is left out.
    """
    kept: dict[str, EpisodeState] = {}
    for record in ledger.groups():
        for sibling in record.siblings:
            key = logical_id(record.group_id, sibling.generation_index)
            entry = entries.get(key)
            if entry is not None and _owns(sibling.current_attempt, entry):
                kept[key] = entry
    return kept


def _owns(attempt: RolloutAttemptRecord, entry: EpisodeState) -> bool:
    live = attempt.status in (RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED)
    return (
        live and bool(attempt.turn_keys) and attempt.env_state_revision == entry.env_state_revision
    )
