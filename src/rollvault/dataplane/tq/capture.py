"""A capture of the TransferQueue data plane: keys and layouts now, row bytes on demand.

Taking a capture inside the exclusive cut must stay cheap, so it copies the
controller's index only (a reference per row). The rows' bytes stay in
TransferQueue and are fetched when the snapshot writer asks for a
partition's rows, in its worker thread, after the cut is released. A *pin*
keeps every captured row in TransferQueue until then: the store defers the
physical delete of rows cleared while any capture (or any get) is pinned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.errors import DataPlaneKeyError
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.tq.codec import RowLayout


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """Where one row lives in TransferQueue, and its layout and digest."""

    tq_key: str
    layout: RowLayout
    digest: bytes


FetchRows = Callable[[str, Mapping[str, StoredEntry]], dict[str, RowView]]
"""Blocking fetch of a partition's rows by key (called from any thread)."""


class Pin:
    """Keeps the rows live when it was taken in TransferQueue until it is released.

    Released explicitly or when garbage collected (captures release theirs
    that way, since nothing tells a capture it has been written).
    """

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._lock = threading.Lock()
        self._released = False

    def release(self) -> None:
        """Release once; later calls do nothing."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._release()

    def __del__(self) -> None:
        self.release()


class TransferQueueCapture(DataPlaneCapture):
    """A :class:`DataPlaneCapture` whose rows are fetched from TransferQueue when first read."""

    def __init__(
        self,
        entries: Mapping[str, Mapping[str, StoredEntry]],
        mutation_version: int,
        *,
        fetch: FetchRows,
        pin: Pin,
    ) -> None:
        super().__init__({}, mutation_version)
        self._entries: Mapping[str, Mapping[str, StoredEntry]] = MappingProxyType(
            {name: MappingProxyType(dict(rows)) for name, rows in entries.items()}
        )
        self._fetch = fetch
        self._pin = pin
        self._fetched: dict[str, Mapping[str, RowView]] = {}
        self._fetch_lock = threading.Lock()

    def partitions(self) -> list[str]:
        """Names of the captured partitions (including empty ones), sorted."""
        return sorted(self._entries)

    def rows(self, partition: str) -> Mapping[str, RowView]:
        """The captured rows of ``partition`` (fetched from TransferQueue on first call)."""
        entries = self._partition_entries(partition)
        with self._fetch_lock:
            rows = self._fetched.get(partition)
            if rows is None:
                rows = MappingProxyType(self._fetch(partition, entries))
                self._fetched[partition] = rows
        return rows

    def keys(self, partition: str) -> list[str]:
        """The captured keys of ``partition``, sorted (no fetch)."""
        return sorted(self._partition_entries(partition))

    def row_tokens(self, partition: str) -> Mapping[str, object]:
        """Per key its :class:`StoredEntry`: a new one for every put (no fetch)."""
        return self._partition_entries(partition)

    def select(self, partition: str, keys: Iterable[str]) -> dict[str, RowView]:
        """The captured rows of ``keys`` only, fetched from TransferQueue (or the fetched set)."""
        wanted = list(keys)
        with self._fetch_lock:
            fetched = self._fetched.get(partition)
        if fetched is not None:
            return {key: fetched[key] for key in wanted}
        entries = self._partition_entries(partition)
        return self._fetch(partition, {key: entries[key] for key in wanted})

    def row_counts(self) -> dict[str, int]:
        """Number of captured rows per partition."""
        return {name: len(rows) for name, rows in self._entries.items()}

    @property
    def row_count(self) -> int:
        """Number of captured rows over all partitions."""
        return sum(len(rows) for rows in self._entries.values())

    def without(self, partition: str, keys: Iterable[str]) -> TransferQueueCapture:
        """A capture like this one but without ``keys`` of ``partition``; shares the pin."""
        dropped = set(keys)
        entries = {
            name: {key: e for key, e in rows.items() if name != partition or key not in dropped}
            for name, rows in self._entries.items()
        }
        return TransferQueueCapture(
            entries, self.mutation_version, fetch=self._fetch, pin=self._pin
        )

    def _partition_entries(self, partition: str) -> Mapping[str, StoredEntry]:
        try:
            return self._entries[partition]
        except KeyError:
            raise DataPlaneKeyError(
                f"partition {partition!r} is not in this capture "
                f"(captured partitions: {self.partitions()})"
            ) from None
