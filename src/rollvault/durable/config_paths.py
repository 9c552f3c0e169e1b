"""Config trees as plain JSON data, addressed by segmented dotpaths.

A *path* is a tuple of segments: a mapping key, or ``"[i]"`` for the i-th
element of a list. A *pattern* is a path whose segments may also be ``*``
(exactly one segment) or ``**`` (any number of segments, including none).
``("**", "port")`` matches ``port``, ``server.port`` and ``envs[0].port``.
Users see paths as dotpaths: ``grpo.lr``, ``envs[0].port``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

ConfigPath = tuple[str, ...]


def parse_pattern(pattern: str) -> ConfigPath:
    """Split a dotted pattern such as ``**.log_dir`` into its segments."""
    segments = tuple(pattern.split("."))
    if not pattern or any(not segment for segment in segments):
        raise ValueError(f"config path pattern {pattern!r} has an empty segment")
    return segments


def format_dotpath(path: ConfigPath) -> str:
    """User-facing form of a path: ``a.b[2].c``; ``<root>`` for the empty path."""
    text = ""
    for segment in path:
        is_index = segment.startswith("[") and segment.endswith("]")
        text += segment if is_index or not text else f".{segment}"
    return text or "<root>"


def _path_matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Return whether one segmented dotpath pattern matches a concrete path."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_path_matches(rest, path[start:]) for start in range(len(path) + 1))
    if not path:
        return False
    return head in ("*", path[0]) and _path_matches(rest, path[1:])


_WILD = ("*", "**")


class _PathMatcher:
    """Whether a path matches any of ``patterns``, as ``_path_matches`` says, sorted
    once: a ``("**", name)`` pattern matches exactly the paths ending in ``name`` (a
    set look-up instead of a recursion per start), a pattern with a literal first
    segment only paths starting with it (looked up by that segment); the rest are
    tried on every path. A run's identity drops ~48 patterns from ~200 config keys
    on every resume (run_identity: 1.8 ms with each pattern tried, 0.4 ms sorted)."""

    def __init__(self, patterns: tuple[tuple[str, ...], ...]) -> None:
        self._last: set[str] = set()
        self._by_head: dict[str, list[tuple[str, ...]]] = {}
        self._other: list[tuple[str, ...]] = []
        for pattern in patterns:
            if len(pattern) == 2 and pattern[0] == "**" and pattern[1] not in _WILD:
                self._last.add(pattern[1])
            elif pattern and pattern[0] not in _WILD:
                self._by_head.setdefault(pattern[0], []).append(pattern)
            else:
                self._other.append(pattern)

    def __call__(self, path: tuple[str, ...]) -> bool:
        if path and path[-1] in self._last:
            return True
        candidates = self._by_head.get(path[0], ()) if path else ()
        return any(_path_matches(pattern, path) for pattern in candidates) or any(
            _path_matches(pattern, path) for pattern in self._other
        )


def _drop_excluded_paths(
    value: Any,
    *,
    excluded_paths: tuple[tuple[str, ...], ...],
    path: tuple[str, ...] = (),
) -> Any:
    """Recursively remove denylisted mapping paths from a JSON config dump.

    A mapping entry whose path matches a pattern is dropped with its whole
    subtree, and so is a mapping that only held dropped entries (so adding a
    section of operational settings, say ``server: {port: 80}``, changes
    nothing). List elements are never dropped (that would shift the indices of
    the rest), but mappings inside them are filtered. Returns new containers;
    the input is not modified.
    """
    return _dropped(value, _PathMatcher(excluded_paths), path)


def _dropped(value: Any, excluded: _PathMatcher, path: tuple[str, ...]) -> Any:
    if isinstance(value, Mapping):
        kept: dict[str, Any] = {}
        for key, child in value.items():
            child_path = (*path, str(key))
            if excluded(child_path):
                continue
            filtered = _dropped(child, excluded, child_path)
            if isinstance(child, Mapping) and child and not filtered:
                continue
            kept[key] = filtered
        return kept
    if isinstance(value, list | tuple):
        return [
            _dropped(child, excluded, (*path, f"[{index}]")) for index, child in enumerate(value)
        ]
    return value


def canonical_config(value: Any, *, path: ConfigPath = ()) -> Any:
    """Return a fresh plain-JSON copy of a config tree, refusing what JSON cannot hold.

    Mappings become dicts (keys must be strings), tuples become lists. Raises
    ``TypeError`` or ``ValueError`` naming the dotpath of the offending value.
    """
    if isinstance(value, Mapping):
        copied: dict[str, Any] = {}
        for key, child in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"config key {key!r} at {format_dotpath(path)} must be a string, "
                    f"got {type(key).__name__}"
                )
            copied[key] = canonical_config(child, path=(*path, key))
        return copied
    if isinstance(value, list | tuple):
        return [canonical_config(child, path=(*path, f"[{i}]")) for i, child in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"config value at {format_dotpath(path)} is {value!r}; JSON cannot hold it"
        )
    if value is None or isinstance(value, bool):
        return value
    # Subclasses (StrEnum, IntEnum) become their plain value, as JSON sees them.
    for plain in (str, int, float):
        if isinstance(value, plain):
            return plain(value)
    raise TypeError(
        f"config value at {format_dotpath(path)} has type {type(value).__name__}; "
        "only mappings, lists, strings, numbers, booleans and null are allowed"
    )


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, ASCII only, no NaN."""
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return text.encode("ascii")
