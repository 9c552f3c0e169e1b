"""The in-process data plane: the default backend on one machine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint
from rollvault.dataplane.errors import (
    DataPlaneConflictError,
    DataPlaneFieldError,
    DataPlaneKeyError,
)
from rollvault.dataplane.keyed_store import KeyedStore
from rollvault.dataplane.rows import Row, RowInput, RowView, row_difference


class EmbeddedDataPlane(KeyedStore[RowView]):
    """In-process :class:`~rollvault.dataplane.interface.DataPlane` on the controller's loop.

    Rows live in plain dicts on the event loop; stored rows and their arrays
    are immutable, so reads and captures share them without copying. Checkpoint
    file I/O runs in a worker thread.
    """

    async def put(self, partition: str, rows: Mapping[str, RowInput]) -> None:
        """Store ``rows`` in ``partition``, all or nothing; identical re-puts are no-ops.

        Different content under an existing key raises ``DataPlaneConflictError``
        and stores nothing. Arrays are copied once and stored read-only.
        """
        validated = self._checked_rows(partition, rows)
        async with self._cut.mutation():
            stored = self._index.get(partition, {})
            for key, row in validated.items():
                problem = None if key not in stored else row_difference(stored[key], row)
                if problem is not None:
                    raise DataPlaneConflictError(
                        f"partition {partition!r}, key {key!r} already holds a different row "
                        f"({problem}); a put may only repeat identical rows"
                    )
            fresh = {key: row for key, row in validated.items() if key not in stored}
            self._index.setdefault(partition, {}).update(fresh)

    async def get(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, Row]:
        """Rows of ``keys``, all fields or only ``fields``; missing ones raise ``KeyError``s."""
        wanted_keys, wanted_fields = self._wanted(partition, keys, fields)
        stored = self._index.get(partition, {})
        result: dict[str, Row] = {}
        for key in wanted_keys:
            row = stored.get(key)
            if row is None:
                raise DataPlaneKeyError(f"partition {partition!r} has no key {key!r}")
            result[key] = (
                dict(row) if wanted_fields is None else _select(partition, key, row, wanted_fields)
            )
        return result

    async def clear(self, partition: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from ``partition``; absent keys are counted, not errors."""
        doomed = self._checked_keys(partition, keys)
        async with self._cut.mutation():
            stored = self._index.get(partition, {})
            for key in doomed:
                if stored.pop(key, None) is None:
                    self._absent_clears += 1

    def capture(self) -> DataPlaneCapture:
        """Immutable view of every row now: one reference copy per row."""
        return DataPlaneCapture(self._index, self._cut.mutation_version)

    async def load_verified(self, loaded: LoadedCheckpoint, *, source: Path) -> dict[str, Any]:
        """Replace the empty store with a checkpoint :func:`read_checkpoint` already verified.

        Restore verifies a snapshot while choosing it; this saves reading its
        rows twice. The store takes the loaded rows over. ``source`` names
        the checkpoint in errors.
        """
        async with self._cut.mutation():
            # Rows may have been put while the files were being read.
            self._require_empty(source)
            self._index = loaded.partitions
        return loaded.user_metadata


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
