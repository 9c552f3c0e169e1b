"""The data plane on TransferQueue: rows in its storage units, keys on the controller.

Rows are put and fetched by key and partition through TransferQueue's client
(one batched call per put, get or clear). The controller keeps an index per
partition: key to :class:`~rollvault.dataplane.tq.capture.StoredEntry`
(TransferQueue key, layout, digest), so ``keys``, ``has`` and ``row_count``
are local and a capture costs a reference per row, as with the embedded store.

Snapshots are written in the embedded store's own format (safetensors files
and ``metadata.json``, :mod:`rollvault.dataplane.checkpoint_io`) from rows
fetched back out of TransferQueue; TransferQueue's own checkpoint (pickle,
replaced by ``rmtree`` then ``rename``) is never used. Loading a snapshot puts
its rows into TransferQueue again.

Each stored row has a TransferQueue key of its own (``"{key}#{serial}"``) in a
TransferQueue partition of this store (``"{namespace}.{partition}"``), so a key
cleared and put again never meets its old bytes, and several stores may share
one TransferQueue (a restore into a fresh store beside the old one, tests).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import transfer_queue
from tensordict import TensorDict

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint
from rollvault.dataplane.errors import (
    DataPlaneConflictError,
    DataPlaneError,
    DataPlaneKeyError,
)
from rollvault.dataplane.keyed_store import KeyedStore
from rollvault.dataplane.rows import (
    Row,
    RowInput,
    RowView,
    row_difference,
)
from rollvault.dataplane.tq.capture import Pin, StoredEntry, TransferQueueCapture
from rollvault.dataplane.tq.codec import EncodedRow, check_fields, decode_row, encode_row

ROW_FIELD = "row"
"""The one TransferQueue field of every row: its arrays' bytes as a ``uint8`` tensor."""
BATCH_ROWS = 1024
"""Rows per TransferQueue call when loading or capturing many rows."""


class TransferQueueDataPlane(KeyedStore[StoredEntry]):
    """:class:`~rollvault.dataplane.interface.DataPlane` on a running TransferQueue.

    Start TransferQueue first (:func:`rollvault.dataplane.tq.session.start_transfer_queue`).
    Mutations hold the mutation cut across their TransferQueue call, so a
    capture never sees a row whose bytes are not stored yet. Unlike the
    embedded store, ``get`` returns fresh read-only arrays, decoded from the
    bytes TransferQueue sends back.
    """

    def __init__(self, cut: DataPlaneMutationCut, *, namespace: str | None = None) -> None:
        _require_transfer_queue()
        super().__init__(cut)
        self._namespace = namespace or uuid.uuid4().hex[:12]
        self._serial = itertools.count()
        self._writing: dict[str, asyncio.Event] = {}
        # Physical deletes: deferred while anything is pinned, then doomed
        # until the next clear (or close) sends them. Pins are released from
        # any thread (garbage collection), hence the lock; reentrant, because a
        # collection may finalize a capture while this thread holds it.
        self._pin_lock = threading.RLock()
        self._pins = 0
        self._deferred: list[tuple[str, str]] = []
        self._doomed: list[tuple[str, str]] = []

    # ------------------------------------------------------------ reads

    def held_row_count(self) -> int:
        """Cleared rows still in TransferQueue because a capture (or a get) may read them.

        A capture lets go when it is garbage collected; the worker thread that
        wrote it may drop its last reference a moment after the write returns.
        """
        with self._pin_lock:
            return len(self._deferred)

    async def get(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, Row]:
        """Rows of ``keys``, all fields or only ``fields``; missing ones raise ``KeyError``s."""
        wanted_keys, wanted_fields = self._wanted(partition, keys, fields)
        stored = self._index.get(partition, {})
        entries: dict[str, StoredEntry] = {}
        for key in wanted_keys:
            entry = stored.get(key)
            if entry is None:
                raise DataPlaneKeyError(f"partition {partition!r} has no key {key!r}")
            if wanted_fields is not None:
                check_fields(partition, key, entry.layout, wanted_fields)
            entries[key] = entry
        if not entries:
            return {}
        # Pinned before the first await: a clear meanwhile must not delete these rows yet.
        pin = self._pin()
        try:
            await self._written(entries.values())
            payloads = await self._tq_get(partition, [e.tq_key for e in entries.values()])
        finally:
            pin.release()
        return {
            key: dict(decode_row(entries[key].layout, payloads[entries[key].tq_key], wanted_fields))
            for key in wanted_keys
        }

    # ------------------------------------------------------------ mutations

    async def put(self, partition: str, rows: Mapping[str, RowInput]) -> None:
        """Store ``rows`` in ``partition``, all or nothing; identical re-puts are no-ops."""
        validated = self._checked_rows(partition, rows)
        encoded = {key: encode_row(row) for key, row in validated.items()}
        async with self._cut.mutation():
            stored = self._index.get(partition, {})
            for key, row in encoded.items():
                entry = stored.get(key)
                if entry is not None and entry.digest != row.digest:
                    await self._raise_conflict(partition, key, entry, validated[key])
            # No await from here to the reservation: the check above still holds.
            stored = self._index.setdefault(partition, {})
            repeated = [stored[key] for key in encoded if key in stored]
            fresh = {
                key: StoredEntry(self._tq_key(key), row.layout, row.digest)
                for key, row in encoded.items()
                if key not in stored
            }
            stored.update(fresh)
            if fresh:
                await self._write(partition, stored, fresh, encoded)
            await self._written(repeated)

    async def clear(self, partition: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from ``partition``; absent keys are counted, not errors."""
        doomed = self._checked_keys(partition, keys)
        async with self._cut.mutation():
            stored = self._index.get(partition, {})
            removed: list[StoredEntry] = []
            for key in doomed:
                entry = stored.pop(key, None)
                if entry is None:
                    self._absent_clears += 1
                else:
                    removed.append(entry)
            self._retire(partition, removed)
        await self._send_deletes()

    # ------------------------------------------------------------ snapshots

    def capture(self) -> DataPlaneCapture:
        """Immutable view of every row now: one reference copy per row, bytes fetched later."""
        return TransferQueueCapture(
            self._index, self._cut.mutation_version, fetch=self._fetch_blocking, pin=self._pin()
        )

    async def load_verified(self, loaded: LoadedCheckpoint, *, source: Path) -> dict[str, Any]:
        """Put a checkpoint :func:`read_checkpoint` already verified into TransferQueue.

        The index switches to the loaded rows only once all of them are
        stored; if rows were put meanwhile, the loaded ones are deleted again
        and ``DataPlaneNotEmptyError`` leaves the store as it was.
        """
        async with self._cut.mutation():
            self._require_empty(source)
            index: dict[str, dict[str, StoredEntry]] = {}
            for partition, rows in loaded.partitions.items():
                encoded = {key: encode_row(row) for key, row in rows.items()}
                entries = {
                    key: StoredEntry(self._tq_key(key), row.layout, row.digest)
                    for key, row in encoded.items()
                }
                index[partition] = entries
                for chunk in _chunks(list(entries), BATCH_ROWS):
                    await self._tq_put(
                        partition,
                        [entries[key].tq_key for key in chunk],
                        [encoded[key].payload for key in chunk],
                    )
            if self.row_count():
                for partition, entries in index.items():
                    self._retire(partition, list(entries.values()))
                await self._send_deletes()
                self._require_empty(source)
            self._index = index
        return loaded.user_metadata

    async def close(self) -> None:
        """Send the deletes still owed to TransferQueue (the session stops it)."""
        await self._send_deletes()

    # ------------------------------------------------------------ internals

    def _tq_key(self, key: str) -> str:
        return f"{key}#{next(self._serial)}"

    def _tq_partition(self, partition: str) -> str:
        return f"{self._namespace}.{partition}"

    async def _write(
        self,
        partition: str,
        stored: dict[str, StoredEntry],
        fresh: dict[str, StoredEntry],
        encoded: dict[str, EncodedRow],
    ) -> None:
        events = {entry.tq_key: asyncio.Event() for entry in fresh.values()}
        self._writing.update(events)
        try:
            await self._tq_put(
                partition,
                [entry.tq_key for entry in fresh.values()],
                [encoded[key].payload for key in fresh],
            )
        except BaseException:
            # All or nothing: forget the reservations (a clear may have taken some already).
            for key, entry in fresh.items():
                if stored.get(key) is entry:
                    del stored[key]
            raise
        finally:
            for tq_key, event in events.items():
                del self._writing[tq_key]
                event.set()

    async def _written(self, entries: Iterable[StoredEntry]) -> None:
        """Wait until the rows of ``entries`` put by concurrent calls are in TransferQueue."""
        for entry in entries:
            event = self._writing.get(entry.tq_key)
            if event is not None:
                await event.wait()

    async def _raise_conflict(
        self, partition: str, key: str, entry: StoredEntry, new: RowView
    ) -> None:
        old = (await self.get(partition, [key]))[key]
        problem = row_difference(old, new) or "digests differ"
        raise DataPlaneConflictError(
            f"partition {partition!r}, key {key!r} already holds a different row "
            f"({problem}); a put may only repeat identical rows"
        )

    async def _tq_put(self, partition: str, tq_keys: list[str], payloads: list[bytes]) -> None:
        column = torch.nested.nested_tensor(
            [_payload_tensor(payload) for payload in payloads], layout=torch.jagged
        )
        await transfer_queue.async_kv_batch_put(
            keys=tq_keys,
            partition_id=self._tq_partition(partition),
            fields=TensorDict({ROW_FIELD: column}, batch_size=[len(tq_keys)]),
        )

    async def _tq_get(self, partition: str, tq_keys: list[str]) -> dict[str, Any]:
        data = await transfer_queue.async_kv_batch_get(
            keys=tq_keys, partition_id=self._tq_partition(partition), select_fields=[ROW_FIELD]
        )
        return _payloads(tq_keys, data)

    def _fetch_blocking(
        self, partition: str, entries: Mapping[str, StoredEntry]
    ) -> dict[str, RowView]:
        """A capture's rows, fetched with TransferQueue's blocking client (any thread)."""
        rows: dict[str, RowView] = {}
        keys = list(entries)
        for chunk in _chunks(keys, BATCH_ROWS):
            tq_keys = [entries[key].tq_key for key in chunk]
            data = transfer_queue.kv_batch_get(
                keys=tq_keys, partition_id=self._tq_partition(partition), select_fields=[ROW_FIELD]
            )
            payloads = _payloads(tq_keys, data)
            for key in chunk:
                rows[key] = decode_row(entries[key].layout, payloads[entries[key].tq_key])
        return rows

    def _pin(self) -> Pin:
        with self._pin_lock:
            self._pins += 1
        return Pin(self._unpin)

    def _unpin(self) -> None:
        with self._pin_lock:
            self._pins -= 1
            if self._pins == 0:
                self._doomed.extend(self._deferred)
                self._deferred.clear()

    def _retire(self, partition: str, entries: list[StoredEntry]) -> None:
        retired = [(self._tq_partition(partition), entry.tq_key) for entry in entries]
        with self._pin_lock:
            (self._deferred if self._pins else self._doomed).extend(retired)

    async def _send_deletes(self) -> None:
        with self._pin_lock:
            doomed, self._doomed = self._doomed, []
        by_partition: dict[str, list[str]] = {}
        for tq_partition, tq_key in doomed:
            by_partition.setdefault(tq_partition, []).append(tq_key)
        for tq_partition, tq_keys in by_partition.items():
            # A put still in flight for a cleared key must land before its delete.
            for tq_key in tq_keys:
                event = self._writing.get(tq_key)
                if event is not None:
                    await event.wait()
            for chunk in _chunks(tq_keys, BATCH_ROWS):
                await transfer_queue.async_kv_clear(keys=chunk, partition_id=tq_partition)


def _require_transfer_queue() -> None:
    try:
        transfer_queue.get_client()
    except AssertionError as exc:  # how transfer_queue says it was not initialized
        raise DataPlaneError(
            "TransferQueue is not running in this process: start it first "
            "(rollvault.dataplane.tq.session.start_transfer_queue)"
        ) from exc


def _payload_tensor(payload: bytes) -> torch.Tensor:
    if not payload:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _payloads(tq_keys: list[str], data: TensorDict) -> dict[str, npt.NDArray[np.uint8]]:
    tensors = data[ROW_FIELD].unbind()
    if len(tensors) != len(tq_keys):
        raise DataPlaneError(
            f"TransferQueue returned {len(tensors)} rows for {len(tq_keys)} keys "
            f"(first key {tq_keys[0]!r})"
        )
    return {key: tensor.numpy() for key, tensor in zip(tq_keys, tensors, strict=True)}


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[start : start + size] for start in range(0, len(items), size)]
