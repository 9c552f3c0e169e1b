"""The runtime prompt payload: what the dataset hands the rollout pump.

It is runtime-only state. The ledger persists a :class:`~rollvault.ledger.records.PromptRef`
instead and a restore rebinds the payload from the dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from rollvault.ledger.errors import PromptIdentityError


class DatumSpec(TypedDict):
    """One dataset prompt as the rollout pump dispatches it."""

    idx: int
    """Dataset index; ``str(idx)`` is the ledger's durable ``sample_id``."""
    task_name: NotRequired[str | None]
    """Task (environment) the prompt belongs to, when the dataset has several."""
    prompt_token_ids: NotRequired[list[int]]
    """Tokenized prompt."""
    prompt_text: NotRequired[str]
    """Prompt as text."""
    messages: NotRequired[list[dict[str, str]]]
    """Prompt as a chat: ``{"role": ..., "content": ...}`` turns in order (a file dataset's
    chat-format rows, ``dataset.messages_key``). A model gate renders it with the
    tokenizer's chat template; a datum holds it instead of ``prompt_text``."""
    extra_env_info: NotRequired[dict[str, Any]]
    """Whatever the environment needs to score a response (answers, seeds, ...)."""


def datum_task_name(payload: object, *, group_id: str) -> str | None:
    """Check that ``payload`` is a prompt mapping and return its task name.

    Only the identity fields are checked here (``idx`` and ``task_name``); the
    rest belongs to the Gate.
    """
    if not isinstance(payload, Mapping):
        raise PromptIdentityError(
            f"group {group_id!r}: prompt payload must be a mapping (DatumSpec), "
            f"got {type(payload).__name__}"
        )
    idx = payload.get("idx")
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise PromptIdentityError(
            f"group {group_id!r}: prompt payload field 'idx' must be an int dataset index, "
            f"got {idx!r}"
        )
    task_name = payload.get("task_name")
    if task_name is not None and not isinstance(task_name, str):
        raise PromptIdentityError(
            f"group {group_id!r}: prompt payload field 'task_name' must be a str or None, "
            f"got {task_name!r}"
        )
    return task_name
