"""Which of a segment's entries an index holds: the two encodings of that set.

Version 3's ``live`` (:func:`encode_live`, :func:`decode_live`), written by every index
of version 3 or later: ``[]`` when every entry is held (the common case), else run
lengths (held first, then alternately dropped and held) or the raw bitmap
(little-endian bit order), whichever is shorter in JSON. Version 2's base64 bitmap
(:func:`encode_live_bitmap`, :func:`decode_live_bitmap`) with its count of held
entries. The data plane's row indexes and the controller's group-facts index use both
(``noun`` names what an entry is in the messages).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import msgspec
import numpy as np


def encode_live(count: int, held: Sequence[int]) -> list[int] | bytes:
    """Version 3's ``live`` of ``count`` ordinals with ``held`` set: ``[]`` when all are,
    else run lengths (held first) or the raw bitmap, whichever encodes shorter in JSON."""
    if len(set(held)) == count:
        return []
    bits = np.zeros(count, dtype=bool)
    bits[list(held)] = True
    changes = (np.flatnonzero(bits[1:] != bits[:-1]) + 1).tolist()
    boundaries = [0, *changes, count]
    runs = [] if bits[0] else [0]
    runs += [end - begin for begin, end in zip(boundaries, boundaries[1:], strict=False)]
    bitmap = np.packbits(bits, bitorder="little").tobytes()
    if len(msgspec.json.encode(runs)) <= len(msgspec.json.encode(bitmap)):
        return runs
    return bitmap


def decode_live(live: list[int] | bytes, count: int) -> list[bool]:
    """The held ordinals version 3's ``live`` records, one bool per ordinal.

    Raises ``ValueError`` saying what is wrong: runs that do not add up to
    ``count``, a zero-length run other than the first, all rows held written as
    runs rather than ``[]``; a bitmap of the wrong length or with bits set beyond
    ``count``.
    """
    if isinstance(live, bytes):
        if len(live) != -(-count // 8):
            raise ValueError(f"{len(live)} bytes for {count} rows (expected {-(-count // 8)})")
        bits = np.unpackbits(np.frombuffer(live, dtype=np.uint8), bitorder="little")
        if bits[count:].any():
            raise ValueError(f"bits set beyond row {count}")
        wanted: list[bool] = bits[:count].astype(bool).tolist()
        return wanted
    if not live:
        return [True] * count
    if 0 in live[1:]:
        raise ValueError(f"run {live.index(0, 1)} is empty (only the first run may be)")
    if sum(live) != count:
        raise ValueError(f"runs add up to {sum(live)} rows, the segment has {count}")
    if len(live) == 1:
        raise ValueError("one run holds every row (written as [])")
    wanted = []
    for position, length in enumerate(live):
        wanted += [position % 2 == 0] * length
    return wanted


def encode_live_bitmap(count: int, held: Sequence[int]) -> str:
    """Base64 of the bitmap over ``count`` ordinals with ``held`` set (little-endian bit order).

    The form every segment index uses for the entries of a segment a snapshot
    still holds (rows here; the controller's per-group facts too).
    """
    bits = np.zeros(count, dtype=bool)
    bits[list(held)] = True
    return base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode()


def decode_live_bitmap(
    encoded: str, count: int, live: int, *, noun: str = "row", live_field: str = "live_rows"
) -> list[bool]:
    """The bitmap :func:`encode_live_bitmap` wrote, one bool per ordinal.

    Raises ``ValueError`` saying what is wrong: not base64, the wrong length
    for ``count`` ordinals, bits set beyond them, or not ``live`` bits set
    (``noun`` names an entry and ``live_field`` the count in the messages).
    """
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError as exc:
        raise ValueError(f"not base64: {exc}") from exc
    if len(raw) != -(-count // 8):
        raise ValueError(f"{len(raw)} bytes for {count} {noun}s (expected {-(-count // 8)})")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if bits[count:].any():
        raise ValueError(f"bits set beyond {noun} {count}")
    wanted = bits[:count].astype(bool)
    if int(wanted.sum()) != live:
        raise ValueError(f"{int(wanted.sum())} {noun}s set, {live_field} records {live}")
    return wanted.tolist()
