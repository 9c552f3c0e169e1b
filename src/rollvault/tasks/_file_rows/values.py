"""A row's values as JSON: what a datum may hold, whatever file format they came from.

A row reaches the reward function as ``sample`` and is encoded into the
prompt's identity digest, so it must be plain JSON: strings, finite numbers,
booleans, null, lists and string-keyed mappings. Parquet's richer values are
converted where there is one obvious text form (dates, times and timestamps
in ISO 8601, decimals as their digits); anything else is refused, naming the
field, rather than guessed at.
"""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

from rollvault.tasks._file_rows.errors import RowPlace

__all__ = ["json_row"]

_ISO_TYPES = (datetime.datetime, datetime.date, datetime.time)


def json_row(row: dict[Any, Any], place: RowPlace) -> dict[str, Any]:
    """A JSON-safe copy of ``row``; refuses a value JSON cannot hold, naming its field."""
    return {_key(key, place, ""): _json_value(value, place, str(key)) for key, value in row.items()}


def _key(key: object, place: RowPlace, field: str) -> str:
    if not isinstance(key, str):
        raise place.error(
            f"a mapping key must be a string, got {key!r} ({type(key).__name__})",
            field=field or None,
        )
    return key


def _json_value(value: object, place: RowPlace, field: str) -> Any:
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise place.error(f"{value!r} is not a number JSON can hold", field=field)
        return value
    if isinstance(value, dict):
        return {
            _key(key, place, field): _json_value(child, place, f"{field}.{key}")
            for key, child in value.items()
        }
    if isinstance(value, list | tuple):
        return [_json_value(child, place, f"{field}[{i}]") for i, child in enumerate(value)]
    if isinstance(value, _ISO_TYPES):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise place.error(f"{value} is not a number JSON can hold", field=field)
        return str(value)
    raise place.error(
        f"a value of type {type(value).__name__} cannot be part of a row (rows hold strings, "
        "numbers, booleans, null, lists and mappings; dates and decimals become strings)",
        field=field,
    )
