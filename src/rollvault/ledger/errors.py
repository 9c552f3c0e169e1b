"""Errors raised by the recovery ledger.

Every error names what it is about (group, sibling, attempt, status, or the
JSON path of a persisted field) so a failed restore or an illegal transition
can be diagnosed from the message alone.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every error raised by :mod:`rollvault.ledger`."""


class LedgerTransitionError(LedgerError):
    """A state transition that the ledger's state machines do not allow.

    Raised before anything changes: the ledger is exactly as it was. The
    attributes repeat what the message says, for callers that branch on it.
    """

    def __init__(
        self,
        message: str,
        *,
        group_id: str,
        transition: str,
        status: str,
        generation_index: int | None = None,
        attempt_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.group_id = group_id
        self.transition = transition
        self.status = status
        self.generation_index = generation_index
        self.attempt_id = attempt_id


class UnknownGroupError(LedgerError, LookupError):
    """The ledger holds no group with the requested id."""

    def __str__(self) -> str:
        # LookupError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class DuplicateGroupError(LedgerError):
    """A group id that the ledger already holds was reserved again."""


class InvalidLedgerInputError(LedgerError, ValueError):
    """An argument of a ledger call is malformed (wrong type, out of range)."""


class InvalidReceiptError(InvalidLedgerInputError):
    """A Gate receipt does not have the documented shape."""


class PromptIdentityError(InvalidLedgerInputError):
    """A runtime prompt payload does not resolve to the group's durable prompt key."""


class StaleAttemptError(LedgerError):
    """A result names a gate rollout id that is not the sibling's current attempt.

    This is the fencing check: a late result from a superseded attempt must
    never be recorded against its replacement.
    """


class SealConflictError(LedgerError):
    """A sealed attempt was sealed again with a different receipt, reward or keys."""


class PromptPayloadUnboundError(LedgerError):
    """A restored group has no runtime prompt payload bound yet."""


class CheckpointUnsafeError(LedgerError):
    """The ledger holds state whose canonical publication outcome is ambiguous."""


class ForeignCutError(LedgerError):
    """A mutator was given a different mutation cut than the one the ledger is bound to."""


class LedgerStateError(LedgerError, ValueError):
    """A persisted ledger state or sidecar is invalid; the message says where."""


class UnsupportedSchemaVersionError(LedgerStateError):
    """A persisted state carries a schema version this build cannot read."""
