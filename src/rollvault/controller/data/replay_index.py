"""The replay buffer index: canonical groups waiting for training, metadata only.

The rows themselves live in the data plane's ``train`` partition; this index
says which groups are ready, which weights generated them and, under the
``in_order`` sampler, which step each one belongs to. The capacity and
in-flight semaphores belong to the pumps, not to this index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import msgspec

__all__ = [
    "REPLAY_INDEX_SCHEMA_VERSION",
    "ReplayBufferIndex",
    "ReplayEntry",
    "ReplayIndexError",
    "ReplayIndexState",
]

REPLAY_INDEX_SCHEMA_VERSION = 1

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class ReplayIndexError(ValueError):
    """An index operation or state that would break the index's rules; nothing changed."""


class ReplayEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One finalized group: where it came from and which weights generated it.

    ``sample_id`` is the dataset index as a string (the ledger's prompt key);
    ``target_step`` is ``None`` under the ``windowed`` sampler.
    """

    group_id: NonEmptyStr
    sample_id: NonEmptyStr
    epoch: NonNegativeInt
    start_weight_version: NonNegativeInt
    end_weight_version: NonNegativeInt
    target_step: NonNegativeInt | None


class ReplayIndexState(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The persisted index: entries in the order they were added."""

    schema_version: int
    entries: tuple[ReplayEntry, ...]


class ReplayBufferIndex:
    """Canonical groups waiting for training, in the order they were finalized."""

    def __init__(self) -> None:
        self._entries: dict[str, ReplayEntry] = {}
        # step -> its group ids in insertion order (a dict used as an ordered set).
        self._by_step: dict[int, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._entries

    def __iter__(self) -> Iterator[ReplayEntry]:
        return iter(list(self._entries.values()))

    def get(self, group_id: str) -> ReplayEntry | None:
        """The entry of ``group_id``, or ``None`` if it is not waiting."""
        return self._entries.get(group_id)

    def target_steps(self) -> list[int]:
        """Steps that have at least one waiting group, ascending."""
        return sorted(self._by_step)

    def count_for_step(self, step: int) -> int:
        """Waiting groups stamped ``step``."""
        return len(self._by_step.get(step, ()))

    def add(self, entry: ReplayEntry) -> None:
        """Index one finalized group; a group already indexed is an error."""
        _check_entry(entry, where="ReplayBufferIndex.add")
        if entry.group_id in self._entries:
            raise ReplayIndexError(
                f"ReplayBufferIndex.add: group {entry.group_id!r} is already indexed "
                f"(target step {self._entries[entry.group_id].target_step})"
            )
        self._insert(entry)

    def remove(self, group_id: str) -> ReplayEntry:
        """Drop one group from the index and return its entry."""
        entry = self._entries.get(group_id)
        if entry is None:
            raise ReplayIndexError(f"ReplayBufferIndex.remove: group {group_id!r} is not indexed")
        self._delete(entry)
        return entry

    def step_entries(self, step: int) -> list[ReplayEntry]:
        """The groups stamped ``step``, in the order they were added, left in the index."""
        return [self._entries[group_id] for group_id in self._by_step.get(step, ())]

    def window_entries(
        self, trainer_version: int, max_staleness_versions: int, limit: int
    ) -> list[ReplayEntry]:
        """Up to ``limit`` groups fresh enough to train now, left in the index.

        Fresh means ``trainer_version - start_weight_version <=
        max_staleness_versions``. The oldest fresh groups go first (they expire
        soonest), ties in the order they were added.
        """
        fresh = [
            entry
            for entry in self._entries_by_age(trainer_version)
            if trainer_version - entry.start_weight_version <= max_staleness_versions
        ]
        return fresh[: max(limit, 0)]

    def take_step(self, step: int) -> list[ReplayEntry]:
        """Remove and return :meth:`step_entries`."""
        return [self.remove(entry.group_id) for entry in self.step_entries(step)]

    def take_window(
        self, trainer_version: int, max_staleness_versions: int, limit: int
    ) -> list[ReplayEntry]:
        """Remove and return :meth:`window_entries`."""
        window = self.window_entries(trainer_version, max_staleness_versions, limit)
        return [self.remove(entry.group_id) for entry in window]

    def take_stale(self, trainer_version: int, max_staleness_versions: int) -> list[ReplayEntry]:
        """Remove and return every group too stale to train at ``trainer_version``."""
        stale = [
            entry
            for entry in self._entries_by_age(trainer_version)
            if trainer_version - entry.start_weight_version > max_staleness_versions
        ]
        return [self.remove(entry.group_id) for entry in stale]

    def state_dict(self) -> ReplayIndexState:
        """The entries in insertion order (immutable, so nothing aliases live state)."""
        return ReplayIndexState(
            schema_version=REPLAY_INDEX_SCHEMA_VERSION, entries=tuple(self._entries.values())
        )

    def load_state_dict(self, state: ReplayIndexState) -> None:
        """Fill this empty index from ``state``; any problem is rejected before anything changes."""
        if self._entries:
            raise ReplayIndexError(
                f"ReplayBufferIndex.load_state_dict: the index already holds {len(self)} groups; "
                "restore loads into an empty index"
            )
        _check_state(state)
        for entry in state.entries:
            self._insert(entry)

    def _entries_by_age(self, trainer_version: int) -> list[ReplayEntry]:
        ahead = [
            e.group_id for e in self._entries.values() if e.start_weight_version > trainer_version
        ]
        if ahead:
            raise ReplayIndexError(
                f"groups {ahead} have start_weight_version ahead of trainer_version "
                f"{trainer_version}; weights cannot come from the future"
            )
        # sorted() is stable, so equal versions keep insertion order.
        return sorted(self._entries.values(), key=lambda entry: entry.start_weight_version)

    def _insert(self, entry: ReplayEntry) -> None:
        self._entries[entry.group_id] = entry
        if entry.target_step is not None:
            self._by_step.setdefault(entry.target_step, {})[entry.group_id] = None

    def _delete(self, entry: ReplayEntry) -> None:
        del self._entries[entry.group_id]
        if entry.target_step is not None:
            members = self._by_step[entry.target_step]
            del members[entry.group_id]
            if not members:
                del self._by_step[entry.target_step]


def _check_entry(entry: ReplayEntry, *, where: str) -> None:
    if entry.end_weight_version < entry.start_weight_version:
        raise ReplayIndexError(
            f"{where}: group {entry.group_id!r} has end_weight_version "
            f"{entry.end_weight_version} < start_weight_version {entry.start_weight_version}"
        )


def _check_state(state: ReplayIndexState) -> None:
    try:
        # A state built in Python skipped decoding; re-check the field constraints.
        msgspec.convert(msgspec.to_builtins(state), type=ReplayIndexState, strict=True)
    except msgspec.ValidationError as exc:
        raise ReplayIndexError(f"invalid ReplayIndexState: {exc}") from exc
    if state.schema_version != REPLAY_INDEX_SCHEMA_VERSION:
        raise ReplayIndexError(
            f"ReplayIndexState.schema_version {state.schema_version} is not supported "
            f"(this build reads {REPLAY_INDEX_SCHEMA_VERSION})"
        )
    first_seen: dict[str, int] = {}
    for position, entry in enumerate(state.entries):
        where = f"ReplayIndexState.entries[{position}]"
        _check_entry(entry, where=where)
        if entry.group_id in first_seen:
            raise ReplayIndexError(
                f"{where}: duplicate group_id {entry.group_id!r} "
                f"(first at entries[{first_seen[entry.group_id]}])"
            )
        first_seen[entry.group_id] = position
