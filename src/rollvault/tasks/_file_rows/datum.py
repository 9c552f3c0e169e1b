"""One file row as a prompt datum: its prompt (or chat), its answer, and the row itself.

A plain row becomes ``{"idx", "task_name", "prompt_text", "extra_env_info"}``;
with ``dataset.messages_key`` a chat row becomes ``{"idx", "task_name",
"messages", "extra_env_info"}``. ``extra_env_info`` is ``{"answer": <str or
None>, "row": <the whole row>}``: the reward function gets the row as its
``sample``. Answers that are numbers become strings (``7`` -> ``"7"``,
``2.5`` -> ``"2.5"``, Python's shortest round-trip form); a row without the
answer field, or with null there, has no answer.
"""

from __future__ import annotations

import json
from typing import Any

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks._file_rows.errors import RowPlace
from rollvault.tasks._file_rows.values import json_row

__all__ = ["row_datum"]

_TURN_KEYS = ("role", "content")


def row_datum(
    row: object, *, idx: int, task_name: str, config: DatasetConfig, place: RowPlace
) -> DatumSpec:
    """The datum of ``row`` (the file's row at ``place``), or an error naming the field."""
    if not isinstance(row, dict):
        raise place.error(f"a row must be an object (a mapping of fields), got {_shown(row)}")
    fields = json_row(row, place)
    datum: DatumSpec = {"idx": idx, "task_name": task_name}
    if config.messages_key is not None:
        datum["messages"] = _messages(fields, config.messages_key, place)
    else:
        datum["prompt_text"] = _prompt_text(fields, config.prompt_key, place)
    datum["extra_env_info"] = {"answer": _answer(fields, config.answer_key, place), "row": fields}
    return datum


def _field(fields: dict[str, Any], key: str, setting: str, place: RowPlace) -> Any:
    if key not in fields:
        present = ", ".join(repr(name) for name in fields) or "none"
        raise place.error(
            f"the row has no field {key!r} ({setting}); its fields: {present}", field=key
        )
    return fields[key]


def _prompt_text(fields: dict[str, Any], key: str, place: RowPlace) -> str:
    value = _field(fields, key, "dataset.prompt_key", place)
    if not isinstance(value, str):
        raise place.error(f"the prompt must be a string, got {_shown(value)}", field=key)
    if not value.strip():
        raise place.error("the prompt is empty", field=key)
    return value


def _messages(fields: dict[str, Any], key: str, place: RowPlace) -> list[dict[str, str]]:
    value = _field(fields, key, "dataset.messages_key", place)
    if not isinstance(value, list) or not value:
        raise place.error(
            f"must be a non-empty list of {{role, content}} mappings, got {_shown(value)}",
            field=key,
        )
    return [_turn(turn, place, f"{key}[{i}]") for i, turn in enumerate(value)]


def _turn(turn: object, place: RowPlace, field: str) -> dict[str, str]:
    if not isinstance(turn, dict) or set(turn) != set(_TURN_KEYS):
        keys = f"keys {sorted(turn)}" if isinstance(turn, dict) else _shown(turn)
        raise place.error(
            f"a chat turn must be a mapping with exactly the keys 'role' and 'content', got {keys}",
            field=field,
        )
    for name in _TURN_KEYS:
        value = turn[name]
        if not isinstance(value, str) or (name == "role" and not value):
            kind = "a non-empty string" if name == "role" else "a string"
            raise place.error(f"must be {kind}, got {_shown(value)}", field=f"{field}.{name}")
    return {name: turn[name] for name in _TURN_KEYS}


def _answer(fields: dict[str, Any], key: str | None, place: RowPlace) -> str | None:
    value = fields.get(key) if key is not None else None
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # json_row refused non-finite floats
    raise place.error(
        f"the answer (dataset.answer_key) must be a string or a number, got {_shown(value)}",
        field=key,
    )


def _shown(value: object) -> str:
    """A value for a message, as JSON says it: its kind, and the value when short."""
    kinds = {bool: "boolean", str: "string", int: "number", float: "number", list: "array"}
    kind = "null" if value is None else kinds.get(type(value), "object")
    if value is None:
        return kind
    text = json.dumps(value, ensure_ascii=False)
    return f"{kind} {text}" if len(text) <= 40 else kind
