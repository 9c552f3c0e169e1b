"""The data plane's interface: partitions, keys, and the ``DataPlane`` protocol.

The data plane (TQ in the spec) stores bulk token rows addressed by key inside
named partitions. Only keys and small metadata cross the controller; the
recovery ledger never holds tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import DataPlaneCheckpointInfo
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint
from rollvault.dataplane.errors import DataPlaneValidationError
from rollvault.dataplane.rows import Row, RowInput

STAGING_PARTITION = "rollout_staging"
"""One row per model call of an attempt, keyed ``{gate_rollout_id}/{call_index}``."""
TRAIN_PARTITION = "train"
"""One canonical row per sibling, keyed ``{group_id}_g{generation_index}``."""

_CALL_INDEX = re.compile(r"0|[1-9][0-9]*")


class StagingKey(NamedTuple):
    """A parsed staging key: the attempt's gate rollout id and the model call's index."""

    gate_rollout_id: str
    call_index: int


def staging_key(gate_rollout_id: str, call_index: int) -> str:
    """Key of one model call's staged row: ``"{gate_rollout_id}/{call_index}"``."""
    if not isinstance(gate_rollout_id, str) or not gate_rollout_id or "/" in gate_rollout_id:
        raise DataPlaneValidationError(
            f"gate rollout id must be a non-empty str without '/', got {gate_rollout_id!r}"
        )
    if isinstance(call_index, bool) or not isinstance(call_index, int) or call_index < 0:
        raise DataPlaneValidationError(
            f"call index of {gate_rollout_id!r} must be an int >= 0, got {call_index!r}"
        )
    return f"{gate_rollout_id}/{call_index}"


def parse_staging_key(key: str) -> StagingKey:
    """Inverse of :func:`staging_key`; a key it could not have produced is an error."""
    gate_rollout_id, slash, index = key.rpartition("/") if isinstance(key, str) else ("", "", "")
    if (
        not slash
        or not gate_rollout_id
        or "/" in gate_rollout_id
        or not _CALL_INDEX.fullmatch(index)
    ):
        raise DataPlaneValidationError(
            f"not a staging key: {key!r} (expected '{{gate_rollout_id}}/{{call_index}}', "
            "call index a decimal int without leading zeros)"
        )
    return StagingKey(gate_rollout_id, int(index))


def train_key(group_id: str, generation_index: int) -> str:
    """Key of a sibling's canonical row: its logical rollout id ``"{group_id}_g{index}"``."""
    if not isinstance(group_id, str) or not group_id:
        raise DataPlaneValidationError(f"group id must be a non-empty str, got {group_id!r}")
    if (
        isinstance(generation_index, bool)
        or not isinstance(generation_index, int)
        or generation_index < 0
    ):
        raise DataPlaneValidationError(
            f"generation index of group {group_id!r} must be an int >= 0, got {generation_index!r}"
        )
    return f"{group_id}_g{generation_index}"


class DataPlane(Protocol):
    """Store of token rows by key inside named partitions (TQ in the spec).

    Mutations (``put``, ``clear``, ``load_checkpoint``) enter the mutation cut
    themselves, so they wait while a checkpoint holds the exclusive section;
    the cut is reentrant, so callers already inside a mutation section (or
    the exclusive section, like restore) may call them too.
    """

    async def put(self, partition: str, rows: Mapping[str, RowInput]) -> None:
        """Store ``rows`` (key to row) in ``partition``, all or nothing.

        A put is idempotent for identical rows: putting the same content again
        under an existing key is a no-op. Putting different content under an
        existing key raises ``DataPlaneConflictError`` and stores none of the
        rows. Malformed rows raise ``DataPlaneValidationError`` naming the
        partition, key and field.
        """
        ...

    async def get(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, Row]:
        """Rows of ``keys`` in ``partition``, with all fields or only ``fields``.

        Arrays are the stored read-only arrays (not copies). A missing key
        raises ``DataPlaneKeyError``, a missing field ``DataPlaneFieldError``
        (both ``KeyError``), naming the partition and key.
        """
        ...

    def keys(self, partition: str) -> list[str]:
        """Keys stored in ``partition``, sorted (empty if it does not exist)."""
        ...

    def has(self, partition: str, key: str) -> bool:
        """Whether ``partition`` holds a row under ``key``."""
        ...

    def partitions(self) -> list[str]:
        """Partitions that exist (put into at least once, or loaded), sorted."""
        ...

    def row_count(self) -> int:
        """Number of rows over all partitions."""
        ...

    def absent_clear_count(self) -> int:
        """How many keys ``clear`` was asked to remove that were not there."""
        ...

    async def clear(self, partition: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from ``partition``.

        Clearing an absent key is allowed (restore cleans leftovers that may
        or may not exist) and is counted in :meth:`absent_clear_count`.
        """
        ...

    def capture(self) -> DataPlaneCapture:
        """An immutable view of every row now, cheap enough for the exclusive cut.

        Costs a reference copy per row: no array copies, no encoding. The
        checkpointer takes it inside ``cut.checkpoint()`` and passes it to
        :meth:`save_checkpoint` after releasing the cut.
        """
        ...

    async def save_checkpoint(
        self,
        directory: Path,
        user_metadata: Mapping[str, Any],
        capture: DataPlaneCapture | None = None,
    ) -> DataPlaneCheckpointInfo:
        """Write ``capture`` (or a fresh capture) and ``user_metadata`` into ``directory``.

        ``directory`` is created if absent and must be empty. Files are not
        fsynced: the caller fsyncs and commits the snapshot. ``user_metadata``
        must be a JSON object that round-trips exactly.
        """
        ...

    async def load_verified(self, loaded: LoadedCheckpoint, *, source: Path) -> dict[str, Any]:
        """Like :meth:`load_checkpoint`, from rows :func:`read_checkpoint` already verified."""
        ...

    async def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Replace the (empty) store's content with a verified checkpoint.

        Returns the saved ``user_metadata``. Raises ``DataPlaneNotEmptyError``
        if the store holds rows and ``DataPlaneCheckpointError`` naming the
        file if anything in ``directory`` is missing, extra or damaged; on
        any error the store is left as it was.
        """
        ...
