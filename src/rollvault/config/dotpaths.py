"""Walking the RunConfig schema by dotpath: leaf types, unknown keys and suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import msgspec

from rollvault.config.errors import ConfigError
from rollvault.config.schema import RunConfig

__all__ = ["check_keys", "leaf_type"]


def check_keys(
    data: Mapping[str, Any], cls: type[msgspec.Struct], prefix: str, source: str
) -> None:
    """Reject unknown keys anywhere in ``data``, naming the dotpath and a suggestion."""
    fields = _field_types(cls)
    for key, value in data.items():
        dotpath = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(str(key), prefix, list(fields), source))
        sub = _struct_type(fields[key])
        if sub is not None and isinstance(value, Mapping):
            check_keys(value, sub, f"{dotpath}.", source)


def leaf_type(dotpath: str, source: str) -> Any:
    """The annotated type of a leaf dotpath; unknown or non-leaf paths are errors."""
    cls: type[msgspec.Struct] = RunConfig
    parts = dotpath.split(".")
    for depth, part in enumerate(parts):
        fields = _field_types(cls)
        prefix = "".join(f"{p}." for p in parts[:depth])
        if part not in fields:
            raise ConfigError(_unknown_key_message(part, prefix, list(fields), source))
        sub = _struct_type(fields[part])
        if depth == len(parts) - 1:
            if sub is not None:
                raise ConfigError(f"{source}: {dotpath} is a section; set one of its keys")
            return fields[part]
        if sub is None:
            raise ConfigError(f"{source}: {prefix}{part} is a value, not a section")
        cls = sub
    raise AssertionError("unreachable: a dotpath has at least one segment")


def _unknown_key_message(key: str, prefix: str, names: list[str], source: str) -> str:
    dotpath = f"{prefix}{key}"
    message = f"{source}: unknown config key {dotpath!r}"
    suggestion = _suggest(key, prefix, names)
    if suggestion is not None:
        message += f"; did you mean {suggestion!r}?"
    return message + f" (valid keys here: {', '.join(prefix + n for n in sorted(names))})"


def _suggest(key: str, prefix: str, names: list[str]) -> str | None:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return prefix + close[0]
    # Not close to anything here: maybe a key of another section (by leaf name).
    by_leaf_name: dict[str, str] = {}
    for path in _leaf_paths(RunConfig, ""):
        by_leaf_name.setdefault(path.rsplit(".", 1)[-1], path)
    close = difflib.get_close_matches(key, list(by_leaf_name), n=1, cutoff=0.8)
    return by_leaf_name[close[0]] if close else None


def _leaf_paths(cls: type[msgspec.Struct], prefix: str) -> list[str]:
    paths = []
    for name, annotation in _field_types(cls).items():
        sub = _struct_type(annotation)
        if sub is None:
            paths.append(prefix + name)
        else:
            paths.extend(_leaf_paths(sub, f"{prefix}{name}."))
    return paths


def _field_types(cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {field.name: field.type for field in msgspec.structs.fields(cls)}


def _struct_type(annotation: Any) -> type[msgspec.Struct] | None:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return None
