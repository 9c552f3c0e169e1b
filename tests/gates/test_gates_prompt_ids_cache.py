"""The local model gate renders a group's prompt once for all its siblings."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from rollvault.gates.prompt_ids_cache import PromptIdsCache


class CountingRenderer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompt: Mapping[str, object]) -> list[int]:
        self.calls += 1
        return [ord(c) for c in str(prompt["prompt_text"])]


def test_siblings_of_a_group_render_its_prompt_once() -> None:
    cache, render = PromptIdsCache(), CountingRenderer()
    prompt = {"idx": 3, "prompt_text": "12+34="}
    ids = [cache.prompt_ids("g3", dict(prompt), render) for _ in range(8)]
    assert render.calls == 1 and (cache.hits, cache.misses) == (7, 1)
    assert all(i == [ord(c) for c in "12+34="] for i in ids)
    ids[0].append(-1)  # each caller gets its own list: a change cannot reach the cache
    assert cache.prompt_ids("g3", prompt, render) == [ord(c) for c in "12+34="]


def test_a_changed_prompt_under_the_same_group_renders_again() -> None:
    cache, render = PromptIdsCache(), CountingRenderer()
    assert cache.prompt_ids("g", {"prompt_text": "ab"}, render) == [97, 98]
    assert cache.prompt_ids("g", {"prompt_text": "abc"}, render) == [97, 98, 99]
    assert render.calls == 2


def test_the_least_recently_used_group_is_evicted_beyond_capacity() -> None:
    cache, render = PromptIdsCache(capacity=2), CountingRenderer()
    for group in ("a", "b", "a", "c"):  # "a" was used after "b": "b" goes
        cache.prompt_ids(group, {"prompt_text": group}, render)
    assert render.calls == 3
    cache.prompt_ids("a", {"prompt_text": "a"}, render)
    assert render.calls == 3
    cache.prompt_ids("b", {"prompt_text": "b"}, render)
    assert render.calls == 4


def test_a_render_error_is_not_cached() -> None:
    cache = PromptIdsCache()

    def failing(_prompt: Mapping[str, object]) -> list[int]:
        raise ValueError("no tokens")

    for _ in range(2):
        with pytest.raises(ValueError, match="no tokens"):
            cache.prompt_ids("g", {"prompt_text": ""}, failing)
    with pytest.raises(ValueError, match="capacity"):
        PromptIdsCache(capacity=0)
