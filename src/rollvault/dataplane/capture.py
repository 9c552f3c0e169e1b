"""A point-in-time view of the data plane's rows, taken inside the mutation cut."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from rollvault.dataplane.errors import DataPlaneKeyError
from rollvault.dataplane.rows import RowView


class DataPlaneCapture:
    """The set of live rows at one instant, safe to write after the cut is released.

    Taking one costs a reference copy per row: stored rows and their arrays
    are immutable, so the capture shares them with the live store, and later
    puts and clears (which only add or drop references in the store's own
    dicts) cannot change what the capture sees.
    """

    __slots__ = ("_partitions", "_mutation_version")

    def __init__(
        self, partitions: Mapping[str, Mapping[str, RowView]], mutation_version: int
    ) -> None:
        self._partitions: Mapping[str, Mapping[str, RowView]] = MappingProxyType(
            {name: MappingProxyType(dict(rows)) for name, rows in partitions.items()}
        )
        self._mutation_version = mutation_version

    @property
    def mutation_version(self) -> int:
        """The cut's ``mutation_version`` when the capture was taken."""
        return self._mutation_version

    def partitions(self) -> list[str]:
        """Names of the captured partitions (including empty ones), sorted."""
        return sorted(self._partitions)

    def rows(self, partition: str) -> Mapping[str, RowView]:
        """The captured rows of ``partition``, by key (read-only)."""
        try:
            return self._partitions[partition]
        except KeyError:
            raise DataPlaneKeyError(
                f"partition {partition!r} is not in this capture "
                f"(captured partitions: {self.partitions()})"
            ) from None

    def keys(self, partition: str) -> list[str]:
        """The captured keys of ``partition``, sorted."""
        return sorted(self.rows(partition))

    def row_tokens(self, partition: str) -> Mapping[str, object]:
        """Per key, an object that is the same (``is``) exactly while the key holds the same row.

        Cheap (no row bytes are read): an incremental snapshot compares them
        with the previous snapshot's to find the rows new since. Here the
        stored rows themselves, which are immutable and never reused.
        """
        return self.rows(partition)

    def select(self, partition: str, keys: Iterable[str]) -> dict[str, RowView]:
        """The captured rows of ``keys`` only (a store may fetch just those)."""
        rows = self.rows(partition)
        return {key: rows[key] for key in keys}

    def row_counts(self) -> dict[str, int]:
        """Number of captured rows per partition."""
        return {name: len(rows) for name, rows in self._partitions.items()}

    @property
    def row_count(self) -> int:
        """Number of captured rows over all partitions."""
        return sum(len(rows) for rows in self._partitions.values())

    def without(self, partition: str, keys: Iterable[str]) -> DataPlaneCapture:
        """A capture like this one but without ``keys`` of ``partition``.

        Copies references only; call it after the cut is released.
        """
        dropped = set(keys)
        partitions = {
            name: {key: row for key, row in rows.items() if name != partition or key not in dropped}
            for name, rows in self._partitions.items()
        }
        return DataPlaneCapture(partitions, self._mutation_version)
