"""The in-process data plane: the default backend on one machine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import DataPlaneCheckpointInfo, check_user_metadata
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint, read_checkpoint, write_checkpoint
from rollvault.dataplane.errors import (
    DataPlaneConflictError,
    DataPlaneFieldError,
    DataPlaneKeyError,
    DataPlaneNotEmptyError,
    DataPlaneValidationError,
)
from rollvault.dataplane.interface import DataPlane
from rollvault.dataplane.rows import (
    Row,
    RowInput,
    RowView,
    check_key,
    check_partition_name,
    row_difference,
    validate_row,
)


def string_sequence(values: object, what: str) -> list[str]:
    """``values`` as a list of keys or fields; a bare ``str`` is refused, naming ``what``."""
    # A bare str is iterable too; taking it for a list of one-letter keys would
    # silently clear or fetch the wrong rows.
    if isinstance(values, str | bytes):
        raise DataPlaneValidationError(f"{what} must be a sequence of str, not a single {values!r}")
    if not isinstance(values, Iterable):
        raise DataPlaneValidationError(f"{what} must be a sequence of str, got {values!r}")
    return list(values)


class EmbeddedDataPlane(DataPlane):
    """In-process :class:`~rollvault.dataplane.interface.DataPlane` on the controller's loop.

    Rows live in plain dicts on the event loop; stored rows and their arrays
    are immutable, so reads and captures share them without copying. Checkpoint
    file I/O runs in a worker thread.
    """

    def __init__(self, cut: DataPlaneMutationCut) -> None:
        self._cut = cut
        self._partitions: dict[str, dict[str, RowView]] = {}
        self._absent_clears = 0

    async def put(self, partition: str, rows: Mapping[str, RowInput]) -> None:
        """Store ``rows`` in ``partition``, all or nothing; identical re-puts are no-ops.

        Different content under an existing key raises ``DataPlaneConflictError``
        and stores nothing. Arrays are copied once and stored read-only.
        """
        check_partition_name(partition)
        if not isinstance(rows, Mapping):
            raise DataPlaneValidationError(
                f"partition {partition!r}: rows must be a mapping of key to row, "
                f"got {type(rows).__name__}"
            )
        # Validated and copied before entering the cut, to keep mutation sections short.
        validated = {
            check_key(partition, key): validate_row(partition, key, row)
            for key, row in rows.items()
        }
        async with self._cut.mutation():
            stored = self._partitions.get(partition, {})
            for key, row in validated.items():
                problem = None if key not in stored else row_difference(stored[key], row)
                if problem is not None:
                    raise DataPlaneConflictError(
                        f"partition {partition!r}, key {key!r} already holds a different row "
                        f"({problem}); a put may only repeat identical rows"
                    )
            fresh = {key: row for key, row in validated.items() if key not in stored}
            self._partitions.setdefault(partition, {}).update(fresh)

    async def get(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, Row]:
        """Rows of ``keys``, all fields or only ``fields``; missing ones raise ``KeyError``s."""
        wanted_keys = string_sequence(keys, f"partition {partition!r}: keys")
        wanted_fields = None if fields is None else string_sequence(fields, "fields")
        stored = self._partitions.get(partition, {})
        result: dict[str, Row] = {}
        for key in wanted_keys:
            row = stored.get(key)
            if row is None:
                raise DataPlaneKeyError(f"partition {partition!r} has no key {key!r}")
            result[key] = (
                dict(row) if wanted_fields is None else _select(partition, key, row, wanted_fields)
            )
        return result

    def keys(self, partition: str) -> list[str]:
        """Keys in ``partition``, sorted (empty if it does not exist)."""
        return sorted(self._partitions.get(partition, {}))

    def has(self, partition: str, key: str) -> bool:
        """Whether ``partition`` holds ``key``."""
        return key in self._partitions.get(partition, {})

    def partitions(self) -> list[str]:
        """Partitions put into at least once (or loaded), sorted; they stay when emptied."""
        return sorted(self._partitions)

    def row_count(self, partition: str | None = None) -> int:
        """Rows over all partitions, or in ``partition`` only."""
        if partition is not None:
            return len(self._partitions.get(partition, {}))
        return sum(len(rows) for rows in self._partitions.values())

    def absent_clear_count(self) -> int:
        """Keys ``clear`` was asked to remove that were not there, since creation."""
        return self._absent_clears

    async def clear(self, partition: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from ``partition``; absent keys are counted, not errors."""
        check_partition_name(partition)
        doomed = [
            check_key(partition, key)
            for key in string_sequence(keys, f"partition {partition!r}: keys")
        ]
        async with self._cut.mutation():
            stored = self._partitions.get(partition, {})
            for key in doomed:
                if stored.pop(key, None) is None:
                    self._absent_clears += 1

    def capture(self) -> DataPlaneCapture:
        """Immutable view of every row now: one reference copy per row."""
        return DataPlaneCapture(self._partitions, self._cut.mutation_version)

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

    async def load_verified(self, loaded: LoadedCheckpoint, *, source: Path) -> dict[str, Any]:
        """Replace the empty store with a checkpoint :func:`read_checkpoint` already verified.

        Restore verifies a snapshot while choosing it; this saves reading its
        rows twice. The store takes the loaded rows over. ``source`` names
        the checkpoint in errors.
        """
        async with self._cut.mutation():
            # Rows may have been put while the files were being read.
            self._require_empty(source)
            self._partitions = loaded.partitions
        return loaded.user_metadata

    def _require_empty(self, directory: Path) -> None:
        if self.row_count():
            raise DataPlaneNotEmptyError(
                f"cannot load the data-plane checkpoint {directory}: the store holds "
                f"{self.row_count()} rows (partitions {self.partitions()}); "
                "load only into an empty data plane"
            )


def _select(partition: str, key: str, row: RowView, fields: list[str]) -> Row:
    selected: Row = {}
    for field in fields:
        if field not in row:
            raise DataPlaneFieldError(
                f"partition {partition!r}, key {key!r} has no field {field!r} "
                f"(fields: {sorted(row)})"
            )
        selected[field] = row[field]
    return selected
