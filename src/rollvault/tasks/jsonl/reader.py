"""JSONL rows: one JSON object per line, read with the standard library's strict parser.

Lines are numbered from 1 as an editor shows them. Blank lines (a trailing
newline, a separating empty line) are skipped, so row ``i`` is the ``i``-th
non-blank line; messages and resume checks name the line. The file is
UTF-8 (a leading byte-order mark is allowed). Strict JSON: ``NaN`` and
``Infinity`` are refused, and so is an object with the same key twice (the
standard parser would silently keep the last one).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollvault.tasks._file_rows import RowPlace, read_dataset_file

__all__ = ["read_jsonl_rows"]


class _Refused(ValueError):
    """A JSON text the strict reading refuses (non-finite constant, duplicate key)."""


def read_jsonl_rows(path: Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` of every non-blank line of ``path``."""
    data = read_dataset_file(path)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    for number, raw in enumerate(data.split(b"\n"), start=1):
        place = RowPlace(path, "line", number)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise place.error(f"not UTF-8 text: {exc}") from exc
        if text.strip():
            yield number, _parse(text, place)


def _parse(text: str, place: RowPlace) -> object:
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise place.error(f"invalid JSON: {exc.msg} at column {exc.colno}") from exc
    except _Refused as exc:
        raise place.error(f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise place.error("invalid JSON: nested too deeply") from exc


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON (write a number, or null)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, child in pairs:
        if key in value:
            raise _Refused(f"the key {key!r} appears twice in one object")
        value[key] = child
    return value
