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

From 4 to 5: every attempt gets ``turn_keys`` (empty) and
``env_state_revision`` (0): before version 5 an attempt was one model call
and committed no turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.statuses import AttemptFailureKind, RolloutAttemptStatus

_V3: Final = 3
_V4: Final = 4

_AttemptUpgrade = Callable[[Mapping[str, Any], str], dict[str, Any]]


def upgrade_sidecar_state(state: object) -> object:
    """A version 3 or 4 sidecar envelope as version 5; any other value unchanged."""
    for version, step in _STEPS:
        if isinstance(state, Mapping) and _is_version(state, version):
            upgraded = dict(state, schema_version=version + 1)
            if "ledger" in state:
                upgraded["ledger"] = _upgrade_ledger_once(
                    state["ledger"], version, step, path="$.ledger"
                )
            state = upgraded
    return state


def upgrade_ledger_state(state: object, *, path: str = "$") -> object:
    """A version 3 or 4 ledger state as version 5; any other value unchanged."""
    for version, step in _STEPS:
        state = _upgrade_ledger_once(state, version, step, path=path)
    return state


def _upgrade_ledger_once(
    state: object, version: int, step: _AttemptUpgrade, *, path: str
) -> object:
    if not isinstance(state, Mapping) or not _is_version(state, version):
        return state
    upgraded = dict(state, schema_version=version + 1)
    groups = state.get("groups")
    if isinstance(groups, list):
        upgraded["groups"] = [
            _upgrade_group(group, f"{path}.groups[{position}]", step)
            for position, group in enumerate(groups)
        ]
    return upgraded


def _is_version(state: Mapping[str, Any], version: int) -> bool:
    found = state.get("schema_version")
    return isinstance(found, int) and not isinstance(found, bool) and found == version


def _upgrade_group(group: object, path: str, step: _AttemptUpgrade) -> object:
    if not isinstance(group, Mapping) or not isinstance(group.get("siblings"), list):
        return group
    siblings = []
    for position, sibling in enumerate(group["siblings"]):
        if isinstance(sibling, Mapping) and isinstance(sibling.get("attempts"), list):
            where = f"{path}.siblings[{position}]"
            sibling = dict(
                sibling,
                attempts=[
                    step(attempt, f"{where}.attempts[{number}]")
                    if isinstance(attempt, Mapping)
                    else attempt
                    for number, attempt in enumerate(sibling["attempts"])
                ],
            )
        siblings.append(sibling)
    return dict(group, siblings=siblings)


def _reject_new_field(attempt: Mapping[str, Any], name: str, version: int, path: str) -> None:
    if name in attempt:
        raise LedgerStateError(
            f"rollout recovery ledger state: {path}: unknown field {name!r} in schema "
            f"version {version} (it was added in version {version + 1})"
        )


def _attempt_3_to_4(attempt: Mapping[str, Any], path: str) -> dict[str, Any]:
    _reject_new_field(attempt, "failure_kind", _V3, path)
    return dict(attempt, failure_kind=_kind_of(attempt))


def _attempt_4_to_5(attempt: Mapping[str, Any], path: str) -> dict[str, Any]:
    # Versions before 5 ran one model call per attempt and committed no turns.
    for name in ("turn_keys", "env_state_revision"):
        _reject_new_field(attempt, name, _V4, path)
    return dict(attempt, turn_keys=[], env_state_revision=0)


_STEPS: Final[tuple[tuple[int, _AttemptUpgrade], ...]] = (
    (_V3, _attempt_3_to_4),
    (_V4, _attempt_4_to_5),
)


def _kind_of(attempt: Mapping[str, Any]) -> str | None:
    if attempt.get("status") != RolloutAttemptStatus.FAILED.value:
        return None
    reason = attempt.get("failure_reason")
    if isinstance(reason, str) and reason.startswith(f"{AttemptFailureKind.DATA.value}:"):
        return AttemptFailureKind.DATA.value
    return AttemptFailureKind.INFRA.value
