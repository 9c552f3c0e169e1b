"""The check that a runtime prompt is the prompt a group was reserved for."""

from __future__ import annotations

from rollvault.ledger.datum import DatumSpec, datum_task_name
from rollvault.ledger.errors import PromptIdentityError
from rollvault.ledger.records import PromptRef


def _validate_prompt_identity(
    prompt_ref: PromptRef,
    prompt_payload: DatumSpec,
    *,
    group_id: str,
) -> None:
    """Require a runtime prompt to resolve the ledger's durable dataset key.

    The payload resolves to ``prompt_ref`` when ``str(payload["idx"])`` equals
    ``prompt_ref.sample_id`` and its ``task_name`` (None when absent) equals
    ``prompt_ref.task_name``. A restore that rebinds the wrong prompt would
    silently train a group's rewards against another prompt; this refuses it.
    """
    task_name = datum_task_name(prompt_payload, group_id=group_id)
    sample_id = str(prompt_payload["idx"])
    if sample_id != prompt_ref.sample_id:
        raise PromptIdentityError(
            f"group {group_id!r}: runtime prompt idx {sample_id!r} does not resolve to the "
            f"ledger's prompt_ref sample_id {prompt_ref.sample_id!r}"
        )
    if task_name != prompt_ref.task_name:
        raise PromptIdentityError(
            f"group {group_id!r}: runtime prompt task_name {task_name!r} does not match the "
            f"ledger's prompt_ref task_name {prompt_ref.task_name!r}"
        )
