"""Property tests for path patterns, dropping excluded paths and differences."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollvault.durable.compatibility import (
    BootstrapCompatibilityIdentity,
    _compatibility_differences,
)
from rollvault.durable.config_paths import (
    _drop_excluded_paths,
    _path_matches,
    _PathMatcher,
    canonical_json,
)

KEY_POOL = ["a", "b", "port", "log_dir", "x_y"]
keys = st.sampled_from(KEY_POOL) | st.text(alphabet="abcz_", min_size=1, max_size=3)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False, width=16)
    | st.text(alphabet="ab ", max_size=3)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
configs = st.dictionaries(keys, values, max_size=5)
# Pairs that are often equal or overlap, not just two unrelated configs.
config_pairs = configs.flatmap(
    lambda old: st.tuples(
        st.just(old),
        st.just(copy.deepcopy(old)) | configs | configs.map(lambda extra: {**old, **extra}),
    )
)
segments = keys | st.sampled_from(["[0]", "[1]"])
paths = st.lists(segments, max_size=5).map(tuple)
patterns = st.lists(st.sampled_from(["*", "**"]) | segments, min_size=1, max_size=4).map(tuple)
pattern_sets = st.lists(patterns, max_size=3).map(tuple)

PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)


def _oracle_matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """The same semantics written as a regular expression over '/seg/seg'."""
    parts = {"*": "/[^/]+", "**": "(?:/[^/]+)*"}
    regex = "".join(parts.get(segment, "/" + re.escape(segment)) for segment in pattern)
    return re.fullmatch(regex, "".join(f"/{segment}" for segment in path)) is not None


def _entries(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any, bool]]:
    """Every (path, value, reached_through_mapping_key) below ``value``."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*path, key), child, True
            yield from _entries(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield (*path, f"[{index}]"), child, False
            yield from _entries(child, (*path, f"[{index}]"))


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    elif isinstance(value, list) and value:
        for index, child in enumerate(value):
            yield from _leaves(child, (*path, f"[{index}]"))
    else:
        yield path, value


def _lookup(value: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for segment in path:
        if segment.startswith("[") and isinstance(value, list):
            index = int(segment[1:-1])
            if index >= len(value):
                return False, None
            value = value[index]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            return False, None
    return True, value


def _parse_dotpath(dotpath: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\[\d+\]|[^.\[\]]+", dotpath))


@PROPERTY_SETTINGS
@given(patterns, paths)
def test_path_matches_agrees_with_a_regex_oracle(
    pattern: tuple[str, ...], path: tuple[str, ...]
) -> None:
    assert _path_matches(pattern, path) == _oracle_matches(pattern, path)


@PROPERTY_SETTINGS
@given(paths, st.data())
def test_a_path_matches_itself_and_its_generalisations(
    path: tuple[str, ...], data: st.DataObject
) -> None:
    assert _path_matches(path, path)
    assert _path_matches(("**",), path)
    assert _path_matches(("*",) * len(path), path)
    assert not _path_matches(("*",) * (len(path) + 1), path)
    start = data.draw(st.integers(0, len(path)))
    stop = data.draw(st.integers(start, len(path)))
    assert _path_matches((*path[:start], "**", *path[stop:]), path)


@PROPERTY_SETTINGS
@given(pattern_sets, paths)
@example((("**", "port"),), ("a", "port"))
@example((("**", "port"),), ("port", "a"))
@example((("**", "*"),), ())
@example((("a", "**"),), ("a",))
def test_the_sorted_matcher_agrees_with_each_pattern_tried(
    excluded: tuple[tuple[str, ...], ...], path: tuple[str, ...]
) -> None:
    assert _PathMatcher(excluded)(path) == any(_path_matches(p, path) for p in excluded)


@PROPERTY_SETTINGS
@given(configs, pattern_sets)
# Found by hypothesis: a mapping inside a list emptied by the drop stays, as {}.
@example({"a": [[{"a": None}]]}, (("*", "*", "*", "*"),))
def test_dropping_removes_every_match_keeps_the_rest_and_is_idempotent(
    config: dict[str, Any], excluded: tuple[tuple[str, ...], ...]
) -> None:
    original = copy.deepcopy(config)
    dropped = _drop_excluded_paths(config, excluded_paths=excluded)
    assert config == original, "the input must not be modified"
    assert _drop_excluded_paths(dropped, excluded_paths=excluded) == dropped
    for path, value, via_key in _entries(dropped):
        assert not (via_key and any(_path_matches(p, path) for p in excluded)), path
        # A mapping emptied by the drop goes with it, unless it is a list element:
        # those are kept (as {}) so the indices of the rest do not shift.
        if value == {} and via_key:
            assert _lookup(config, path) == (True, {}), f"{path} was emptied but kept"
    for path, value in _leaves(config):
        key_prefixes = [
            path[:n] for n in range(1, len(path) + 1) if not path[n - 1].startswith("[")
        ]
        removed = any(_path_matches(p, prefix) for p in excluded for prefix in key_prefixes)
        found, kept = _lookup(dropped, path)
        if removed:
            assert not found, path
        else:
            assert found and canonical_json(kept) == canonical_json(value), path


@PROPERTY_SETTINGS
@given(config_pairs)
def test_differences_are_empty_exactly_when_the_configs_are_equal(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    old, new = pair
    lines = _compatibility_differences(old, new)
    assert (lines == []) == (canonical_json(old) == canonical_json(new))
    assert _compatibility_differences(old, old) == []
    assert len(lines) == len(_compatibility_differences(new, old))


@PROPERTY_SETTINGS
@given(config_pairs)
def test_every_reported_path_exists_in_one_of_the_two(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    old, new = pair
    for line in _compatibility_differences(old, new):
        dotpath, _, change = line.partition(": ")
        path = _parse_dotpath(dotpath)
        in_old, old_value = _lookup(old, path)
        in_new, new_value = _lookup(new, path)
        assert in_old or in_new, line
        assert change.startswith("<missing>") == (not in_old), line
        assert change.endswith("<missing>") == (not in_new), line
        if in_old and in_new:
            assert canonical_json(old_value) != canonical_json(new_value), line


@PROPERTY_SETTINGS
@given(config_pairs)
def test_fingerprints_differ_exactly_when_differences_are_reported(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    old, new = pair

    def identity(config: dict[str, Any]) -> BootstrapCompatibilityIdentity:
        return BootstrapCompatibilityIdentity(schema_version=7, excluded_paths=(), config=config)

    same = identity(old).fingerprint() == identity(new).fingerprint()
    assert same == (_compatibility_differences(old, new) == [])
