"""What every data-plane store shares: an index of partitions to keys, argument checks,
and checkpoints written from a capture.

A store keeps, per partition, a dict from key to whatever it holds for that
row: the row itself (:class:`~rollvault.dataplane.embedded.EmbeddedDataPlane`)
or where the row's bytes are (:class:`~rollvault.dataplane.tq.store.TransferQueueDataPlane`).
Everything answered from that index alone (``keys``, ``has``, ``partitions``,
``row_count``), the checks of a put's rows and of a get's or clear's keys,
and the checkpoint calls, which go through the store's own ``capture`` and
``load_verified``, are written here once.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import DataPlaneCheckpointInfo, check_user_metadata
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint, read_checkpoint, write_checkpoint
from rollvault.dataplane.errors import DataPlaneNotEmptyError, DataPlaneValidationError
from rollvault.dataplane.interface import DataPlane
from rollvault.dataplane.rows import (
    RowInput,
    RowView,
    check_key,
    check_partition_name,
    validate_row,
)

Entry = TypeVar("Entry")
"""What a store's index holds per key: the row, or where its bytes are."""


def string_sequence(values: object, what: str) -> list[str]:
    """``values`` as a list of keys or fields; a bare ``str`` is refused, naming ``what``."""
    # A bare str is iterable too; taking it for a list of one-letter keys would
    # silently clear or fetch the wrong rows.
    if isinstance(values, str | bytes):
        raise DataPlaneValidationError(f"{what} must be a sequence of str, not a single {values!r}")
    if not isinstance(values, Iterable):
        raise DataPlaneValidationError(f"{what} must be a sequence of str, got {values!r}")
    return list(values)


class KeyedStore(DataPlane, Generic[Entry]):
    """A :class:`~rollvault.dataplane.interface.DataPlane` over an index
    ``partition -> key -> Entry`` that lives on the controller's event loop."""

    def __init__(self, cut: DataPlaneMutationCut) -> None:
        self._cut = cut
        self._index: dict[str, dict[str, Entry]] = {}
        self._absent_clears = 0

    # -- answered from the index -------------------------------------------

    def keys(self, partition: str) -> list[str]:
        """Keys in ``partition``, sorted (empty if it does not exist)."""
        return sorted(self._index.get(partition, {}))

    def has(self, partition: str, key: str) -> bool:
        """Whether ``partition`` holds ``key``."""
        return key in self._index.get(partition, {})

    def partitions(self) -> list[str]:
        """Partitions put into at least once (or loaded), sorted; they stay when emptied."""
        return sorted(self._index)

    def row_count(self, partition: str | None = None) -> int:
        """Rows over all partitions, or in ``partition`` only."""
        if partition is not None:
            return len(self._index.get(partition, {}))
        return sum(len(rows) for rows in self._index.values())

    def absent_clear_count(self) -> int:
        """Keys ``clear`` was asked to remove that were not there, since creation."""
        return self._absent_clears

    # -- argument checks ---------------------------------------------------

    @staticmethod
    def _checked_rows(partition: str, rows: Mapping[str, RowInput]) -> dict[str, RowView]:
        """A put's rows, each key checked and each row validated and copied read-only.

        Done before the put enters the cut, to keep mutation sections short.
        """
        check_partition_name(partition)
        if not isinstance(rows, Mapping):
            raise DataPlaneValidationError(
                f"partition {partition!r}: rows must be a mapping of key to row, "
                f"got {type(rows).__name__}"
            )
        return {
            check_key(partition, key): validate_row(partition, key, row)
            for key, row in rows.items()
        }

    @staticmethod
    def _wanted(
        partition: str, keys: Sequence[str], fields: Sequence[str] | None
    ) -> tuple[list[str], list[str] | None]:
        """A get's keys and fields (None: every field) as lists."""
        wanted_keys = string_sequence(keys, f"partition {partition!r}: keys")
        return wanted_keys, None if fields is None else string_sequence(fields, "fields")

    @staticmethod
    def _checked_keys(partition: str, keys: Iterable[str]) -> list[str]:
        """A clear's keys, each checked."""
        check_partition_name(partition)
        return [
            check_key(partition, key)
            for key in string_sequence(keys, f"partition {partition!r}: keys")
        ]

    # -- checkpoints -------------------------------------------------------

    @abstractmethod
    def capture(self) -> DataPlaneCapture: ...

    @abstractmethod
    async def load_verified(self, loaded: LoadedCheckpoint, *, source: Path) -> dict[str, Any]: ...

    async def save_checkpoint(
        self,
        directory: Path,
        user_metadata: Mapping[str, Any],
        capture: DataPlaneCapture | None = None,
    ) -> DataPlaneCheckpointInfo:
        """Write ``capture`` into ``directory`` in a worker thread; no fsync (the caller's job).

        Without a capture, one is taken inside ``cut.checkpoint()``, which
        raises ``CheckpointInsideMutationError`` if the caller holds a
        mutation section.
        """
        metadata = check_user_metadata(user_metadata)
        if capture is None:
            async with self._cut.checkpoint():
                capture = self.capture()
        return await asyncio.to_thread(write_checkpoint, directory, capture, metadata)

    async def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Replace the empty store with a verified checkpoint; return its ``user_metadata``."""
        self._require_empty(directory)
        loaded = await asyncio.to_thread(read_checkpoint, directory)
        return await self.load_verified(loaded, source=directory)

    def _require_empty(self, directory: Path) -> None:
        if self.row_count():
            raise DataPlaneNotEmptyError(
                f"cannot load the data-plane checkpoint {directory}: the store holds "
                f"{self.row_count()} rows (partitions {self.partitions()}); "
                "load only into an empty data plane"
            )
