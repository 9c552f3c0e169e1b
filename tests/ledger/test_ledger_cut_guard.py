"""Every ledger mutator requires the caller to hold a section of the ledger's cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from ledger_testkit import Harness, payload, receipt_for

from rollvault.rollout_recovery import (
    DataPlaneMutationCut,
    ForeignCutError,
    MutationCutNotHeldError,
    RolloutRecoveryLedger,
    SiblingSealResult,
    build_rollout_recovery_state,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
)

Call = Callable[[RolloutRecoveryLedger, DataPlaneMutationCut], Any]


def admitted(h: Harness) -> str:
    return h.reserve(2, group_id="g")


def reserved_phase(h: Harness) -> str:
    return h.reserve(2, group_id="g", admitted=False)


def dispatched(h: Harness) -> str:
    group_id = h.reserve(2, group_id="g")
    h.dispatch(group_id)
    return group_id


def failed(h: Harness) -> str:
    group_id = dispatched(h)
    h.fail(group_id, 0)
    return group_id


def ready(h: Harness) -> str:
    return h.ready_group(2, group_id="g")


def finalizing(h: Harness) -> str:
    group_id = ready(h)
    h.call("mark_finalization_started", group_id)
    return group_id


def seal_one(h: Harness) -> Call:
    gate = h.gate_id("g", 0)
    return lambda ledger, cut: ledger.mark_sibling_sealed(
        cut,
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=receipt_for(gate),
        reward=1.0,
        mask_sample=False,
    )


def seal_cohort(h: Harness) -> Call:
    record = h.group("g")
    results = {
        index: SiblingSealResult(
            gate_rollout_id=gate, receipt=receipt_for(gate), reward=0.0, mask_sample=False
        )
        for index, gate in enumerate(record.gate_rollout_ids)
    }
    return lambda ledger, cut: ledger.mark_group_sealed(cut, "g", results)


def fail_one(h: Harness) -> Call:
    gate = h.gate_id("g", 0)
    return lambda ledger, cut: ledger.mark_sibling_failed(
        cut, "g", generation_index=0, gate_rollout_id=gate, reason="x"
    )


def load(h: Harness) -> Call:
    state = h.ledger.state_dict()
    h.ledger = RolloutRecoveryLedger()
    return lambda ledger, cut: ledger.load_state_dict(cut, state)


def load_parsed(h: Harness) -> Call:
    sidecar = build_rollout_recovery_state(
        h.ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )
    parsed = decode_rollout_recovery_state(encode_rollout_recovery_state(sidecar))
    h.ledger = RolloutRecoveryLedger()
    return lambda ledger, cut: ledger.load_parsed_state(cut, parsed)


def snapshot(ledger: RolloutRecoveryLedger) -> tuple[dict[str, Any], list[Any]]:
    """The persisted state and the runtime payloads (which the state leaves out)."""
    return ledger.state_dict(), [record.runtime_prompt_payload for record in ledger.groups()]


def fixed(call: Call) -> Callable[[Harness], Call]:
    return lambda h: call


MUTATORS: dict[str, tuple[Callable[[Harness], str], Callable[[Harness], Call]]] = {
    "reserve_group": (
        admitted,
        fixed(
            lambda ledger, cut: ledger.reserve_group(
                cut,
                prompt_id="9",
                prompt_payload=payload(9),
                expected_generations=2,
                target_step=0,
                start_weight_version=0,
            )
        ),
    ),
    "mark_group_admitted": (
        reserved_phase,
        fixed(
            lambda ledger, cut: ledger.mark_group_admitted(
                cut, "g", target_step=1, start_weight_version=1
            )
        ),
    ),
    "bind_runtime_prompt": (
        admitted,
        fixed(
            lambda ledger, cut: ledger.bind_runtime_prompt(
                cut, "g", {"idx": 100, "task_name": "math", "prompt_text": "rebound"}
            )
        ),
    ),
    "mark_group_dispatched": (
        admitted,
        fixed(lambda ledger, cut: ledger.mark_group_dispatched(cut, "g")),
    ),
    "mark_sibling_sealed": (dispatched, seal_one),
    "mark_group_sealed": (dispatched, seal_cohort),
    "mark_sibling_failed": (dispatched, fail_one),
    "abandon_unsealed": (dispatched, fixed(lambda ledger, cut: ledger.abandon_unsealed(cut, "g"))),
    "prepare_incomplete_retry": (
        failed,
        fixed(lambda ledger, cut: ledger.prepare_incomplete_retry(cut, "g")),
    ),
    "prepare_for_restart": (dispatched, fixed(lambda ledger, cut: ledger.prepare_for_restart(cut))),
    "mark_finalization_started": (
        ready,
        fixed(lambda ledger, cut: ledger.mark_finalization_started(cut, "g")),
    ),
    "mark_finalization_unknown": (
        finalizing,
        fixed(lambda ledger, cut: ledger.mark_finalization_unknown(cut, "g")),
    ),
    "discard_group": (finalizing, fixed(lambda ledger, cut: ledger.discard_group(cut, "g"))),
    "discard_canonical_groups": (
        ready,
        fixed(lambda ledger, cut: ledger.discard_canonical_groups(cut, {"g"})),
    ),
    "load_state_dict": (ready, load),
    "load_parsed_state": (ready, load_parsed),
}


@pytest.mark.parametrize("mutator", sorted(MUTATORS))
def test_every_mutator_needs_the_cut_and_changes_nothing_without_it(
    harness: Harness, mutator: str
) -> None:
    setup, make_call = MUTATORS[mutator]
    setup(harness)
    call = make_call(harness)
    before = snapshot(harness.ledger)
    with pytest.raises(MutationCutNotHeldError, match=f"RolloutRecoveryLedger.{mutator}"):
        harness.outside_cut(lambda: call(harness.ledger, harness.cut))
    with pytest.raises(MutationCutNotHeldError, match="no running event loop"):
        call(harness.ledger, harness.cut)
    assert snapshot(harness.ledger) == before
    harness.mutate(lambda: call(harness.ledger, harness.cut))
    assert snapshot(harness.ledger) != before, "the same call inside the cut changes the ledger"


def test_mutating_inside_the_exclusive_section_is_allowed(harness: Harness) -> None:
    group_id = dispatched(harness)

    async def restore() -> None:
        async with harness.cut.checkpoint():
            harness.ledger.prepare_for_restart(harness.cut)

    harness.loop.run_until_complete(restore())
    assert len(harness.group(group_id).siblings[0].attempts) == 2


def test_a_ledger_refuses_a_second_cut(harness: Harness) -> None:
    group_id = admitted(harness)
    other = DataPlaneMutationCut()
    before = harness.ledger.state_dict()

    async def with_other_cut() -> None:
        async with other.mutation():
            harness.ledger.mark_group_dispatched(other, group_id)

    with pytest.raises(
        ForeignCutError, match=r"mark_group_dispatched\(group 'g'\): given a different"
    ):
        harness.loop.run_until_complete(with_other_cut())
    assert harness.ledger.state_dict() == before
