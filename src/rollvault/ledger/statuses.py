"""The ledger's state enums, with the spec's names and values (and rollvault's failure kinds)."""

from __future__ import annotations

from enum import StrEnum


class PromptGroupPhase(StrEnum):
    """Durable sampler-admission phase for an unfinished prompt group.

    ``reserved``: the dataset cursor advanced and the ledger row exists, capacity
    is taken. ``admitted``: the sampler's staleness gate let the group through
    and stamped it with a ``target_step``; only admitted groups are dispatched.
    """

    RESERVED = "reserved"
    ADMITTED = "admitted"


class RecoveryGranularity(StrEnum):
    """Unit of completed work reused after a live failure or process restart.

    ``sibling`` reuses every sealed sibling and redoes only the rest.
    ``prompt_group`` is atomic: one failed or interrupted sibling discards the
    whole cohort (needed when siblings must share one weight version or one
    environment seed).
    """

    SIBLING = "sibling"
    PROMPT_GROUP = "prompt_group"


class RolloutAttemptStatus(StrEnum):
    """Lifecycle of one physical Gate execution attempt."""

    RESERVED = "reserved"
    DISPATCHED = "dispatched"
    SEALED = "sealed"
    FAILED = "failed"
    ABANDONED = "abandoned"


class AttemptFailureKind(StrEnum):
    """Why a ``failed`` attempt failed, which decides whose retry budget it spends.

    ``infra``: the machinery failed (worker lost, timeout); it spends the
    sibling's budget. ``data``: the prompt itself failed (environment error);
    it spends the group's budget. ``interrupted``: the attempt was in flight
    when the controller process died, recorded by the restore that found it
    so; it spends the sibling's interruption budget (larger than the infra
    one, as an external kill looks the same), because a prompt whose attempt
    kills the process would otherwise be retried on every restart forever
    (see :mod:`rollvault.controller.loop.retry_budget`).
    """

    INFRA = "infra"
    DATA = "data"
    INTERRUPTED = "interrupted"


class PromptGroupStatus(StrEnum):
    """Ownership lifecycle of one logical prompt group.

    A group leaves the ledger (it is discarded) once its canonical rows are
    published and its staging rows cleaned; there is no ``discarded`` status.
    """

    GENERATING = "generating"
    READY_TO_FINALIZE = "ready_to_finalize"
    FINALIZING = "finalizing"
    FINALIZATION_UNKNOWN = "finalization_unknown"
