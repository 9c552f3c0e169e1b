"""Reading an older persisted version: it is upgraded, as builtins, to the current one.

An upgrade only adds what the newer version has and the older one lacks;
the result is then decoded and checked exactly as strictly as a state of the
current version, so an older state is never trusted more than a new one.
Anything the upgrade does not recognise is left as it is, for the strict
decoder to report with its JSON path.

From 3 to 4: every attempt gets ``failure_kind``. Version 3 has no such
field, but the controller wrote every failure reason as ``"<kind>: <why>"``
with kind ``infra`` or ``data``, so a failed attempt's kind is read from its
reason (``data`` when it starts with ``"data:"``, else ``infra``); other
attempts get none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.statuses import AttemptFailureKind, RolloutAttemptStatus

_V3: Final = 3
_V4: Final = 4


def upgrade_sidecar_state(state: object) -> object:
    """A version 3 sidecar envelope as version 4; any other value unchanged."""
    if not isinstance(state, Mapping) or not _is_version(state, _V3):
        return state
    upgraded = dict(state, schema_version=_V4)
    if "ledger" in state:
        upgraded["ledger"] = upgrade_ledger_state(state["ledger"], path="$.ledger")
    return upgraded


def upgrade_ledger_state(state: object, *, path: str = "$") -> object:
    """A version 3 ledger state as version 4; any other value unchanged."""
    if not isinstance(state, Mapping) or not _is_version(state, _V3):
        return state
    upgraded = dict(state, schema_version=_V4)
    groups = state.get("groups")
    if isinstance(groups, list):
        upgraded["groups"] = [
            _upgrade_group(group, f"{path}.groups[{position}]")
            for position, group in enumerate(groups)
        ]
    return upgraded


def _is_version(state: Mapping[str, Any], version: int) -> bool:
    found = state.get("schema_version")
    return isinstance(found, int) and not isinstance(found, bool) and found == version


def _upgrade_group(group: object, path: str) -> object:
    if not isinstance(group, Mapping) or not isinstance(group.get("siblings"), list):
        return group
    siblings = []
    for position, sibling in enumerate(group["siblings"]):
        if isinstance(sibling, Mapping) and isinstance(sibling.get("attempts"), list):
            where = f"{path}.siblings[{position}]"
            sibling = dict(
                sibling,
                attempts=[
                    _upgrade_attempt(attempt, f"{where}.attempts[{number}]")
                    for number, attempt in enumerate(sibling["attempts"])
                ],
            )
        siblings.append(sibling)
    return dict(group, siblings=siblings)


def _upgrade_attempt(attempt: object, path: str) -> object:
    if not isinstance(attempt, Mapping):
        return attempt
    if "failure_kind" in attempt:
        raise LedgerStateError(
            f"rollout recovery ledger state: {path}: unknown field 'failure_kind' in schema "
            f"version {_V3} (it was added in version {_V4})"
        )
    return dict(attempt, failure_kind=_kind_of(attempt))


def _kind_of(attempt: Mapping[str, Any]) -> str | None:
    if attempt.get("status") != RolloutAttemptStatus.FAILED.value:
        return None
    reason = attempt.get("failure_reason")
    if isinstance(reason, str) and reason.startswith(f"{AttemptFailureKind.DATA.value}:"):
        return AttemptFailureKind.DATA.value
    return AttemptFailureKind.INFRA.value
