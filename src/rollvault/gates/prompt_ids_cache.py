"""The token ids of recent prompts, by group: the N siblings of a group render one prompt.

Rendering a prompt (the tokenizer, or a chat template) is the largest
per-attempt cost of the local model gate after generation itself, and a
group's siblings all ask for the same prompt. The cache keeps the ids of the
last :data:`DEFAULT_CAPACITY` groups; an entry is used only when the
attempt's prompt is equal to the one it was rendered from, so a group whose
prompt changes (a later turn of a multi-turn episode) renders again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

__all__ = ["DEFAULT_CAPACITY", "PromptIdsCache"]

DEFAULT_CAPACITY = 256
"""Groups remembered; more than a run keeps in flight at once (``max_inflight_prompts``)."""


class PromptIdsCache:
    """Rendered prompt ids of the most recently used groups (see the module docstring)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"PromptIdsCache: capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[Mapping[str, object], list[int]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def prompt_ids(
        self,
        group_id: str,
        prompt: Mapping[str, object],
        render: Callable[[Mapping[str, object]], list[int]],
    ) -> list[int]:
        """The ids of ``prompt`` (a fresh list), rendered by ``render`` unless cached."""
        entry = self._entries.get(group_id)
        if entry is not None and entry[0] == prompt:
            self._entries.move_to_end(group_id)
            self.hits += 1
            return list(entry[1])
        ids = render(prompt)
        self.misses += 1
        self._entries[group_id] = (prompt, list(ids))
        self._entries.move_to_end(group_id)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return ids
