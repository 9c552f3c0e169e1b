"""Every attempt and group transition, allowed or refused, through the ledger's API.

A refused transition raises LedgerTransitionError naming the group, sibling,
attempt, current status and requested transition, and changes nothing
(the ledger's state_dict is identical before and after).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from ledger_testkit import Harness, current_statuses, receipt_for

from rollvault.ledger.transitions import (
    ATTEMPT_TRANSITIONS,
    GROUP_TRANSITIONS,
    PHASE_TRANSITIONS,
)
from rollvault.rollout_recovery import (
    LedgerTransitionError,
    PromptGroupPhase,
    PromptGroupStatus,
    RolloutAttemptStatus,
    SealConflictError,
)

A = RolloutAttemptStatus
G = PromptGroupStatus


def test_the_attempt_machine_has_exactly_the_documented_edges() -> None:
    edges = {
        (source, transition.target)
        for transition in ATTEMPT_TRANSITIONS.values()
        for source in transition.sources
    }
    assert edges == {
        (A.RESERVED, A.DISPATCHED),
        (A.DISPATCHED, A.SEALED),
        (A.DISPATCHED, A.FAILED),
        (A.DISPATCHED, A.ABANDONED),
        (A.RESERVED, A.ABANDONED),
        # Only the prompt_group cohort discard reaches a sealed attempt.
        (A.SEALED, A.ABANDONED),
    }
    sealed_exits = [
        event for event, transition in ATTEMPT_TRANSITIONS.items() if A.SEALED in transition.sources
    ]
    assert [event.value for event in sealed_exits] == ["discard_cohort"]
    terminal = {A.FAILED, A.ABANDONED}
    assert not any(terminal & transition.sources for transition in ATTEMPT_TRANSITIONS.values())


def test_the_group_and_phase_machines_have_exactly_the_documented_edges() -> None:
    edges = {
        (source, transition.target)
        for transition in GROUP_TRANSITIONS.values()
        for source in transition.sources
    }
    assert edges == {
        (G.GENERATING, G.READY_TO_FINALIZE),
        (G.READY_TO_FINALIZE, G.FINALIZING),
        (G.FINALIZATION_UNKNOWN, G.FINALIZING),
        (G.FINALIZING, G.FINALIZATION_UNKNOWN),
    }
    phase_edges = {
        (source, transition.target)
        for transition in PHASE_TRANSITIONS.values()
        for source in transition.sources
    }
    assert phase_edges == {(PromptGroupPhase.RESERVED, PromptGroupPhase.ADMITTED)}


def sibling_zero_in(harness: Harness, status: RolloutAttemptStatus) -> str:
    """A generating group of 2 whose sibling 0's current attempt is ``status``.

    Sibling 1 is dispatched (abandoned too when ``status`` is abandoned).
    """
    group_id = harness.reserve(2)
    if status is A.RESERVED:
        harness.dispatch(group_id, [1])
        return group_id
    harness.dispatch(group_id)
    if status is A.SEALED:
        harness.seal(group_id, 0)
    elif status is A.FAILED:
        harness.fail(group_id, 0)
    elif status is A.ABANDONED:
        harness.call("abandon_unsealed", group_id)
    return group_id


def attempt_operation(harness: Harness, group_id: str, operation: str) -> Callable[[], object]:
    gate = harness.gate_id(group_id, 0)
    if operation == "dispatch":
        return lambda: harness.call("mark_group_dispatched", group_id, generation_indices=[0])
    if operation == "seal":
        return lambda: harness.call(
            "mark_sibling_sealed",
            group_id,
            generation_index=0,
            gate_rollout_id=gate,
            receipt=receipt_for(gate, 2),
            reward=0.25,
            mask_sample=True,
        )
    return lambda: harness.call(
        "mark_sibling_failed", group_id, generation_index=0, gate_rollout_id=gate, reason="oom"
    )


ALLOWED_FROM = {"dispatch": {A.RESERVED}, "seal": {A.DISPATCHED}, "fail": {A.DISPATCHED}}
TARGET = {"dispatch": A.DISPATCHED, "seal": A.SEALED, "fail": A.FAILED}


@pytest.mark.parametrize("operation", ["dispatch", "seal", "fail"])
@pytest.mark.parametrize("status", list(A))
def test_attempt_transitions(
    harness: Harness, status: RolloutAttemptStatus, operation: str
) -> None:
    group_id = sibling_zero_in(harness, status)
    assert current_statuses(harness.group(group_id))[0] is status
    attempt_hex = harness.group(group_id).siblings[0].attempts[-1].attempt_uuid.hex
    before = harness.ledger.state_dict()
    run = attempt_operation(harness, group_id, operation)
    if status in ALLOWED_FROM[operation]:
        run()
        assert current_statuses(harness.group(group_id))[0] is TARGET[operation]
        return
    expected_error = (
        SealConflictError if (status, operation) == (A.SEALED, "seal") else LedgerTransitionError
    )
    with pytest.raises(expected_error) as raised:
        run()
    message = str(raised.value)
    assert f"group {group_id!r} sibling 0 attempt {attempt_hex}" in message
    if expected_error is LedgerTransitionError:
        assert f"cannot {operation}" in message
        assert f"status {status.value!r}" in message
        error = raised.value
        assert isinstance(error, LedgerTransitionError)
        assert (error.group_id, error.generation_index, error.attempt_id) == (
            group_id,
            0,
            attempt_hex,
        )
        assert (error.status, error.transition) == (status.value, operation)
    assert harness.ledger.state_dict() == before


def group_in(harness: Harness, status: PromptGroupStatus) -> str:
    """A group of 3 in ``status``; when generating: sibling 0 failed, 1 dispatched, 2 reserved."""
    if status is G.GENERATING:
        group_id = harness.reserve(3)
        harness.dispatch(group_id, [0, 1])
        harness.fail(group_id, 0)
        return group_id
    group_id = harness.ready_group(3)
    if status in (G.FINALIZING, G.FINALIZATION_UNKNOWN):
        harness.call("mark_finalization_started", group_id)
    if status is G.FINALIZATION_UNKNOWN:
        harness.call("mark_finalization_unknown", group_id)
    return group_id


GROUP_OPERATIONS: dict[str, tuple[set[PromptGroupStatus], str]] = {
    "mark_finalization_started": (
        {G.READY_TO_FINALIZE, G.FINALIZATION_UNKNOWN},
        "start_finalization",
    ),
    "mark_finalization_unknown": ({G.FINALIZING}, "finalization_unknown"),
    "discard_group": ({G.FINALIZING, G.FINALIZATION_UNKNOWN}, "discard"),
    "mark_group_dispatched": ({G.GENERATING}, "dispatch"),
    "abandon_unsealed": ({G.GENERATING}, "abandon unsealed work"),
    "prepare_incomplete_retry": ({G.GENERATING}, "retry"),
}


@pytest.mark.parametrize("operation", sorted(GROUP_OPERATIONS))
@pytest.mark.parametrize("status", list(G))
def test_group_transitions(harness: Harness, status: PromptGroupStatus, operation: str) -> None:
    group_id = group_in(harness, status)
    assert harness.group(group_id).status is status
    allowed, transition = GROUP_OPERATIONS[operation]
    before = harness.ledger.state_dict()
    if status in allowed:
        harness.call(operation, group_id)
        assert harness.ledger.state_dict() != before
        return
    with pytest.raises(LedgerTransitionError) as raised:
        harness.call(operation, group_id)
    message = str(raised.value)
    assert f"group {group_id!r}" in message
    assert f"cannot {transition}" in message
    assert repr(status.value) in message
    assert (raised.value.status, raised.value.transition) == (status.value, transition)
    assert harness.ledger.state_dict() == before


def test_group_statuses_move_as_documented(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    assert harness.group(group_id).status is G.GENERATING
    harness.seal(group_id, 1)
    assert harness.group(group_id).status is G.READY_TO_FINALIZE
    harness.call("mark_finalization_started", group_id)
    assert harness.group(group_id).status is G.FINALIZING
    harness.call("mark_finalization_unknown", group_id)
    assert harness.group(group_id).status is G.FINALIZATION_UNKNOWN
    harness.call("mark_finalization_started", group_id)
    assert harness.group(group_id).status is G.FINALIZING
    harness.call("discard_group", group_id)
    assert group_id not in harness.ledger


def test_a_reserved_phase_group_cannot_be_dispatched(harness: Harness) -> None:
    group_id = harness.reserve(2, admitted=False)
    before = harness.ledger.state_dict()
    with pytest.raises(
        LedgerTransitionError, match="cannot dispatch while the group is in phase 'reserved'"
    ):
        harness.dispatch(group_id)
    assert harness.ledger.state_dict() == before


def test_dispatch_checks_every_selected_sibling_before_changing_any(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id, [1])
    before = harness.ledger.state_dict()
    with pytest.raises(LedgerTransitionError, match="sibling 1 attempt .* cannot dispatch"):
        harness.dispatch(group_id, [0, 1, 2])
    assert harness.ledger.state_dict() == before
    harness.dispatch(group_id)
    assert current_statuses(harness.group(group_id)) == [A.DISPATCHED] * 3


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([], "non-empty list"),
        ([0, 0], "repeats an index"),
        ([3], "generation_index 3"),
        (["0"], "generation_index '0'"),
    ],
)
def test_dispatch_rejects_bad_indices(harness: Harness, indices: list[int], message: str) -> None:
    group_id = harness.reserve(3)
    before = harness.ledger.state_dict()
    with pytest.raises(ValueError, match=message):
        harness.dispatch(group_id, indices)
    assert harness.ledger.state_dict() == before


def test_dispatch_with_nothing_reserved_is_refused(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    with pytest.raises(LedgerTransitionError, match="no sibling has a reserved current attempt"):
        harness.dispatch(group_id)


def test_retry_with_nothing_failed_is_refused(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    before = harness.ledger.state_dict()
    with pytest.raises(
        LedgerTransitionError,
        match="cannot retry: no sibling's current attempt is failed or abandoned",
    ):
        harness.call("prepare_incomplete_retry", group_id)
    assert harness.ledger.state_dict() == before


def test_finalization_inputs_require_every_sibling_sealed(harness: Harness) -> None:
    group_id = harness.reserve(2)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    with pytest.raises(
        LedgerTransitionError,
        match="cannot read finalization inputs while the group is 'generating'",
    ):
        harness.ledger.finalization_inputs(group_id)
