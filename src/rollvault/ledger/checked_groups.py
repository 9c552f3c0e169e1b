"""A ledger read from ledger segments: its groups checked as the records a restore loads.

A form 3 or 4 segment's group is decoded into packed pieces
(:class:`~rollvault.ledger.packed_groups.PackedGroup`). A restore used to
turn them into the persisted state (``GroupState``), check that, and convert
it into the ledger's records: three forms of 16k attempts at 1,024 x 16. Here
the pieces become the records at once
(:func:`~rollvault.ledger.packed_groups.group_records`) and the state checks
run on the records (:func:`~rollvault.ledger.state_checks.check_ledger_groups`:
the same rules and messages as on the persisted state), unless the screen
made while building them cleared every rule on the packed pieces (what a
valid ledger gives; anything it cannot clear is checked, so the messages
are the checks'). A group of an older
form (a ``GroupState`` decoded from a JSON segment) is converted and checked
the same way.

The checked records are handed to the first ledger that loads them
(:meth:`CheckedGroups.take`), without a copy. The pieces are kept as read,
so whatever is asked after that (another ledger, the persisted state, a
read-only view for checks) is built from them again, sharing nothing with
the ledger that took the first records.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from rollvault.ledger.packed_groups import (
    PackedGroup,
    group_records,
    group_state,
    screened_group_records,
)
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.state_checks import check_ledger_groups
from rollvault.ledger.state_load import records_of_states
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION, GroupState, LedgerState

GroupSource = PackedGroup | GroupState
"""A group as a segment's record gave it: packed pieces (forms 3-4) or a decoded state (1, 2)."""


class CheckedGroups:
    """A ledger's groups, in order, checked; see the module docstring.

    Its one piece of state is whether its checked records were handed over
    (:meth:`take`): they are built once, moved to the first ledger that takes them,
    and built again from the pieces for any later caller, so every caller owns what
    it gets and no two callers share a record."""

    def __init__(self, sources: Sequence[GroupSource], *, path: str) -> None:
        """Build the records of ``sources`` and check them; raises
        :class:`~rollvault.ledger.errors.LedgerStateError` naming ``path``'s group and field
        (``path``: where the groups are, as ``"$.ledger.groups"``)."""
        records, clean = _screened_records(sources)
        if not clean:  # the screen could not clear them: the checks say what is wrong
            check_ledger_groups(records, path=path)
        self._sources = tuple(sources)
        self._records: list[PromptGroupRecoveryRecord] | None = records
        self._view: list[PromptGroupRecoveryRecord] | None = None

    def __len__(self) -> int:
        return len(self._sources)

    def view(self) -> Sequence[PromptGroupRecoveryRecord]:
        """The groups as records, to read only (cross-file checks): the checked records
        while no ledger holds them, else records built again from the pieces."""
        if self._records is not None:
            return self._records
        if self._view is None:
            self._view = _records(self._sources)
        return self._view

    def take(self) -> dict[str, PromptGroupRecoveryRecord]:
        """The records for a ledger to own, by group id: the checked ones the first time
        (no copy), records built again from the pieces after that."""
        records = self._records
        if records is None:
            records = _records(self._sources)
        else:
            self._records = None
        return {record.group_id: record for record in records}

    def state(self) -> LedgerState:
        """The persisted (version 5) state of the groups, fresh: shares nothing with anyone."""
        groups = [
            group_state(source.header, source.siblings)
            if isinstance(source, PackedGroup)
            else msgspec.convert(msgspec.to_builtins(source), GroupState)
            for source in self._sources
        ]
        return LedgerState(schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION, groups=groups)


def _records(sources: Sequence[GroupSource]) -> list[PromptGroupRecoveryRecord]:
    """Fresh records of ``sources``, in order: the packed ones' built in one batch, the
    decoded states' by one C-level conversion."""
    records, _clean = _screened_records(sources)
    return records


def _screened_records(
    sources: Sequence[GroupSource],
) -> tuple[list[PromptGroupRecoveryRecord], bool]:
    """:func:`_records`, and whether the screen of the packed pieces cleared every state
    check (:func:`~rollvault.ledger.packed_groups.screened_group_records`; never for a
    decoded state's group: those are checked)."""
    packed = [source for source in sources if isinstance(source, PackedGroup)]
    if len(packed) == len(sources):  # every group packed (forms 3-4: what this build writes)
        return screened_group_records(packed)
    states = [source for source in sources if isinstance(source, GroupState)]
    from_packed = iter(group_records(packed))
    from_states = iter(records_of_states(states))
    records = [
        next(from_packed) if isinstance(source, PackedGroup) else next(from_states)
        for source in sources
    ]
    return records, False
