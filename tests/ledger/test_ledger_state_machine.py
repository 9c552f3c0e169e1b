"""Random operation sequences over many groups of both granularities, against a model.

The model is a deliberately simple re-statement of the documented semantics:
per sibling, the list of its attempts' statuses and the staging keys of its
sealed current attempt. Legal rules only run when the model says the step is
legal, so sequences get deep (groups get sealed, finalized, restarted); one
rule tries illegal steps and requires the ledger to refuse them and change
nothing. After every step the invariants are checked: the ledger agrees with
the model; group statuses agree with the siblings; attempt UUIDs are unique;
the expected staging keys are exactly the keys of sealed current attempts;
``from_state_dict(state_dict())`` reproduces the state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from ledger_testkit import Harness, payload, receipt_for

from rollvault.rollout_recovery import (
    CheckpointUnsafeError,
    LedgerTransitionError,
    RecoveryGranularity,
    RolloutRecoveryLedger,
    SealConflictError,
    StaleAttemptError,
    build_rollout_recovery_state,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
)

RESERVED, DISPATCHED, SEALED, FAILED, ABANDONED = (
    "reserved",
    "dispatched",
    "sealed",
    "failed",
    "abandoned",
)
GENERATING, READY, FINALIZING, UNKNOWN = (
    "generating",
    "ready_to_finalize",
    "finalizing",
    "finalization_unknown",
)
PROMPT_GROUP = RecoveryGranularity.PROMPT_GROUP


@dataclass
class ModelGroup:
    """What the documentation says one group looks like."""

    granularity: RecoveryGranularity
    phase: str
    idx: int
    attempts: list[list[str]]
    keys: list[frozenset[str]]
    status: str = GENERATING
    rewards: dict[int, float] = field(default_factory=dict)

    def current(self, index: int) -> str:
        return self.attempts[index][-1]

    def indices(self, *statuses: str) -> list[int]:
        return [i for i in range(len(self.attempts)) if self.current(i) in statuses]

    # -- legality ------------------------------------------------------------------------------

    def can(self, operation: str, index: int = 0) -> bool:
        generating = self.status == GENERATING
        return {
            "admit": self.phase == "reserved",
            "dispatch": generating and self.phase == "admitted" and bool(self.indices(RESERVED)),
            "seal": generating and self.current(index) == DISPATCHED,
            "fail": generating and self.current(index) == DISPATCHED,
            "retry": generating and bool(self.indices(FAILED, ABANDONED)),
            "abandon": generating,
            "start_finalization": self.status in (READY, UNKNOWN),
            "finalization_unknown": self.status == FINALIZING,
            "discard": self.status in (FINALIZING, UNKNOWN),
        }[operation]

    # -- effects -------------------------------------------------------------------------------

    def set_current(self, index: int, status: str) -> None:
        self.attempts[index][-1] = status
        if status != SEALED:
            self.keys[index] = frozenset()

    def abandon_live(self) -> list[int]:
        live = self.indices(RESERVED, DISPATCHED)
        for i in live:
            self.set_current(i, ABANDONED)
        return live

    def abandon_cohort(self) -> None:
        for i in self.indices(RESERVED, DISPATCHED, SEALED):
            self.set_current(i, ABANDONED)

    def mint(self, indices: list[int]) -> None:
        for i in indices:
            self.attempts[i].append(RESERVED)

    def seal(self, index: int, keys: frozenset[str], reward: float) -> None:
        self.set_current(index, SEALED)
        self.keys[index] = keys
        self.rewards[index] = reward
        if not self.indices(RESERVED, DISPATCHED, FAILED, ABANDONED):
            self.status = READY

    def abandon(self) -> None:
        if self.granularity is PROMPT_GROUP:
            self.abandon_cohort()
        else:
            self.abandon_live()

    def retry(self) -> None:
        if self.granularity is PROMPT_GROUP:
            self.abandon_cohort()
            self.mint(list(range(len(self.attempts))))
        else:
            self.mint(self.indices(FAILED, ABANDONED))

    def restart(self) -> None:
        if self.status == FINALIZING:
            self.status = UNKNOWN
        if self.status != GENERATING or not self.indices(RESERVED, DISPATCHED):
            return
        if self.granularity is PROMPT_GROUP:
            self.abandon_cohort()
            self.mint(list(range(len(self.attempts))))
        else:
            self.mint(self.abandon_live())


OPERATIONS = [
    "admit",
    "dispatch",
    "seal",
    "fail",
    "retry",
    "abandon",
    "start_finalization",
    "finalization_unknown",
    "discard",
]


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.harness = Harness()
        self.model: dict[str, ModelGroup] = {}
        self.next_idx = 0
        self.captures: list[tuple[RolloutRecoveryLedger, dict[str, Any]]] = []

    def teardown(self) -> None:
        self.harness.close()

    @property
    def ledger(self) -> RolloutRecoveryLedger:
        return self.harness.ledger

    # -- helpers -------------------------------------------------------------------------------

    def able(self, operation: str) -> list[tuple[str, int]]:
        """(group, sibling) pairs on which ``operation`` is legal."""
        return [
            (group_id, index)
            for group_id, group in self.model.items()
            for index in range(len(group.attempts))
            if group.can(operation, index)
        ]

    def choose(self, data: st.DataObject, operation: str) -> tuple[str, int, ModelGroup]:
        group_id, index = data.draw(st.sampled_from(self.able(operation)), label=operation)
        return group_id, index, self.model[group_id]

    def ledger_call(
        self, operation: str, group_id: str, index: int, keys: int = 1, reward: float = 1.0
    ) -> Callable[[], object]:
        ledger, cut = self.ledger, self.harness.cut
        gate = ledger.get_group(group_id).gate_rollout_id(index)
        calls: dict[str, Callable[[], object]] = {
            "admit": lambda: ledger.mark_group_admitted(
                cut, group_id, target_step=1, start_weight_version=1
            ),
            "dispatch": lambda: ledger.mark_group_dispatched(cut, group_id),
            "seal": lambda: ledger.mark_sibling_sealed(
                cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate,
                receipt=receipt_for(gate, keys),
                reward=reward,
                mask_sample=False,
            ),
            "fail": lambda: ledger.mark_sibling_failed(
                cut, group_id, generation_index=index, gate_rollout_id=gate, reason="boom"
            ),
            "retry": lambda: ledger.prepare_incomplete_retry(cut, group_id),
            "abandon": lambda: ledger.abandon_unsealed(cut, group_id),
            "start_finalization": lambda: ledger.mark_finalization_started(cut, group_id),
            "finalization_unknown": lambda: ledger.mark_finalization_unknown(cut, group_id),
            "discard": lambda: ledger.discard_group(cut, group_id),
        }
        return calls[operation]

    def refused(self, call: Callable[[], object], *errors: type[Exception]) -> None:
        """The call must raise one of ``errors`` and leave the ledger unchanged."""
        before = self.ledger.state_dict()
        try:
            self.harness.mutate(call)
        except errors:
            assert self.ledger.state_dict() == before
        else:
            raise AssertionError("the ledger accepted a step the model refuses")

    # -- legal steps -----------------------------------------------------------------------------

    @initialize()
    def one_group_of_each_granularity(self) -> None:
        self.reserve(2, RecoveryGranularity.SIBLING, True)
        self.reserve(2, PROMPT_GROUP, True)

    @precondition(lambda self: len(self.model) < 6)
    @rule(
        siblings=st.integers(1, 3),
        granularity=st.sampled_from(list(RecoveryGranularity)),
        admitted=st.booleans(),
    )
    def reserve(self, siblings: int, granularity: RecoveryGranularity, admitted: bool) -> None:
        idx = self.next_idx
        self.next_idx += 1
        record = self.harness.mutate(
            lambda: self.ledger.reserve_group(
                self.harness.cut,
                prompt_id=str(idx),
                prompt_payload=payload(idx),
                expected_generations=siblings,
                target_step=idx % 3 if admitted else None,
                start_weight_version=0,
                recovery_granularity=granularity,
                admitted=admitted,
            )
        )
        self.model[record.group_id] = ModelGroup(
            granularity=granularity,
            phase="admitted" if admitted else "reserved",
            idx=idx,
            attempts=[[RESERVED] for _ in range(siblings)],
            keys=[frozenset() for _ in range(siblings)],
        )

    def _legal(self, data: st.DataObject, operation: str) -> tuple[str, int, ModelGroup]:
        group_id, index, group = self.choose(data, operation)
        self.harness.mutate(self.ledger_call(operation, group_id, index))
        return group_id, index, group

    @precondition(lambda self: self.able("admit"))
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        self._legal(data, "admit")[2].phase = "admitted"

    @precondition(lambda self: self.able("dispatch"))
    @rule(data=st.data())
    def dispatch(self, data: st.DataObject) -> None:
        group = self._legal(data, "dispatch")[2]
        for i in group.indices(RESERVED):
            group.set_current(i, DISPATCHED)

    @precondition(lambda self: self.able("seal"))
    @rule(data=st.data(), keys=st.integers(1, 3), reward=st.sampled_from([0.0, 0.5, 1.0]))
    def seal(self, data: st.DataObject, keys: int, reward: float) -> None:
        group_id, index, group = self.choose(data, "seal")
        gate = self.ledger.get_group(group_id).gate_rollout_id(index)
        self.harness.mutate(self.ledger_call("seal", group_id, index, keys, reward))
        group.seal(index, frozenset(receipt_for(gate, keys)["staging_keys"]), reward)

    @precondition(lambda self: self.able("fail"))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        _, index, group = self._legal(data, "fail")
        group.set_current(index, FAILED)

    @precondition(lambda self: self.able("retry"))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self._legal(data, "retry")[2].retry()

    @precondition(lambda self: self.able("abandon"))
    @rule(data=st.data(), damp=st.integers(0, 3))
    def abandon(self, data: st.DataObject, damp: int) -> None:
        if damp != 3:
            return  # damped: abandoning undoes progress, and rules are drawn uniformly
        self._legal(data, "abandon")[2].abandon()

    @precondition(lambda self: self.able("start_finalization"))
    @rule(data=st.data())
    def start_finalization(self, data: st.DataObject) -> None:
        self._legal(data, "start_finalization")[2].status = FINALIZING

    @precondition(lambda self: self.able("finalization_unknown"))
    @rule(data=st.data())
    def finalization_unknown(self, data: st.DataObject) -> None:
        self._legal(data, "finalization_unknown")[2].status = UNKNOWN

    @precondition(lambda self: self.able("discard"))
    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        group_id, _, _ = self._legal(data, "discard")
        del self.model[group_id]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), damp=st.integers(0, 3))
    def discard_canonical(self, data: st.DataObject, damp: int) -> None:
        if damp != 3:
            return  # damped, as abandon
        chosen = data.draw(
            st.sets(st.sampled_from(list(self.model)), max_size=1), label="canonical"
        )
        dropped = self.harness.mutate(
            lambda: self.ledger.discard_canonical_groups(
                self.harness.cut, chosen | {"never-reserved"}
            )
        )
        assert dropped == len(chosen)
        for group_id in chosen:
            del self.model[group_id]

    @precondition(lambda self: any(group.rewards for group in self.model.values()))
    @rule(data=st.data())
    def repeat_a_seal(self, data: st.DataObject) -> None:
        """An identical repeat is a no-op; a different one is refused."""
        sealed = [
            (group_id, index)
            for group_id, group in self.model.items()
            for index in group.indices(SEALED)
        ]
        if not sealed:
            return
        group_id, index = data.draw(st.sampled_from(sealed), label="sealed")
        group = self.model[group_id]
        keys, reward = len(group.keys[index]), group.rewards[index]
        before = self.ledger.state_dict()
        self.harness.mutate(self.ledger_call("seal", group_id, index, keys, reward))
        assert self.ledger.state_dict() == before
        self.refused(
            self.ledger_call("seal", group_id, index, keys, reward + 1.0), SealConflictError
        )

    @precondition(lambda self: any(len(a) > 1 for g in self.model.values() for a in g.attempts))
    @rule(data=st.data())
    def late_result_of_a_superseded_attempt(self, data: st.DataObject) -> None:
        candidates = [
            (group_id, index)
            for group_id, group in self.model.items()
            for index, attempts in enumerate(group.attempts)
            if len(attempts) > 1
        ]
        group_id, index = data.draw(st.sampled_from(candidates), label="superseded")
        old = self.ledger.get_group(group_id).siblings[index].attempts[0]
        gate = f"{group_id}_g{index}_a{old.attempt_uuid.hex}"
        self.refused(
            lambda: self.ledger.mark_sibling_sealed(
                self.harness.cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate,
                receipt=receipt_for(gate),
                reward=1.0,
                mask_sample=False,
            ),
            StaleAttemptError,
        )

    @rule()
    def restart(self) -> None:
        """Kill the process: restore a fresh ledger from the sidecar bytes, then prepare it."""
        finalizing = [group for group in self.model.values() if group.status == FINALIZING]
        if finalizing:
            try:
                self.ledger.assert_checkpoint_safe()
            except CheckpointUnsafeError:
                pass
            else:
                raise AssertionError("a finalizing group was checkpoint-safe")
        data = encode_rollout_recovery_state(
            build_rollout_recovery_state(
                self.ledger, batch_shortfall={}, sampler_stamps_target_steps=True
            )
        )
        parsed = decode_rollout_recovery_state(data)
        fresh = Harness()
        self.harness.close()
        self.harness = fresh
        self.harness.call("load_state_dict", parsed.ledger_state)
        for group_id, group in self.model.items():
            self.harness.call("bind_runtime_prompt", group_id, payload(group.idx))
        self.harness.call("prepare_for_restart")
        for group in self.model.values():
            group.restart()

    def _partial_cohorts(self) -> list[tuple[str, int]]:
        """Dispatched siblings of prompt_group groups that would stay incomplete once sealed."""
        return [
            (group_id, index)
            for group_id, index in self.able("seal")
            if self.model[group_id].granularity is PROMPT_GROUP
            and len(self.model[group_id].indices(SEALED)) < len(self.model[group_id].attempts) - 1
        ]

    @precondition(lambda self: self._partial_cohorts())
    @rule(data=st.data())
    def restart_with_a_partly_sealed_cohort(self, data: st.DataObject) -> None:
        """The case where the granularities differ most: sealed and live siblings at a crash."""
        group_id, index = data.draw(st.sampled_from(self._partial_cohorts()), label="cohort")
        gate = self.ledger.get_group(group_id).gate_rollout_id(index)
        self.harness.mutate(self.ledger_call("seal", group_id, index))
        self.model[group_id].seal(index, frozenset(receipt_for(gate)["staging_keys"]), 1.0)
        self.restart()

    @precondition(lambda self: self.able("start_finalization"))
    @rule(data=st.data())
    def restart_mid_finalization(self, data: st.DataObject) -> None:
        """A crash between starting canonical publication and discarding the group."""
        self._legal(data, "start_finalization")[2].status = FINALIZING
        self.restart()

    # -- illegal steps ---------------------------------------------------------------------------

    @precondition(lambda self: self.model)
    @rule(data=st.data(), operation=st.sampled_from(OPERATIONS))
    def illegal_step_is_refused(self, data: st.DataObject, operation: str) -> None:
        illegal = [
            (group_id, index)
            for group_id, group in self.model.items()
            for index in range(len(group.attempts))
            if not group.can(operation, index)
        ]
        if not illegal:
            return
        group_id, index = data.draw(st.sampled_from(illegal), label=f"illegal {operation}")
        if operation == "seal" and self.model[group_id].current(index) == SEALED:
            return  # a repeated seal is covered by repeat_a_seal
        self.refused(self.ledger_call(operation, group_id, index), LedgerTransitionError)

    @rule()
    def capture(self) -> None:
        """A checkpoint's copy-on-write capture; later steps must never change it."""
        captured = self.ledger.capture()
        self.captures.append((captured, self.ledger.state_dict()))
        del self.captures[:-3]

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def captures_never_change(self) -> None:
        for captured, state in self.captures:
            assert captured.state_dict() == state

    @invariant()
    def ledger_agrees_with_the_model(self) -> None:
        records = self.ledger.groups()
        assert [record.group_id for record in records] == list(self.model)
        for record in records:
            group = self.model[record.group_id]
            assert record.status.value == group.status, record.group_id
            assert record.phase.value == group.phase
            assert record.recovery_granularity is group.granularity
            assert [[a.status.value for a in s.attempts] for s in record.siblings] == group.attempts
            assert record.prompt_payload == payload(group.idx)

    @invariant()
    def statuses_are_consistent_with_siblings(self) -> None:
        for record in self.ledger.groups():
            all_sealed = all(s.attempts[-1].status.value == SEALED for s in record.siblings)
            assert (record.status.value == GENERATING) == (not all_sealed)
            for sibling in record.siblings:
                assert all(a.status.value in (FAILED, ABANDONED) for a in sibling.attempts[:-1])
                for attempt in sibling.attempts:
                    has_result = attempt.receipt is not None or bool(attempt.staging_keys)
                    assert has_result == (attempt.status.value == SEALED)

    @invariant()
    def attempt_uuids_are_unique(self) -> None:
        uuids = [
            a.attempt_uuid for r in self.ledger.groups() for s in r.siblings for a in s.attempts
        ]
        assert len(uuids) == len(set(uuids))

    @invariant()
    def expected_staging_keys_are_the_sealed_current_attempts_keys(self) -> None:
        from_records = {
            key
            for record in self.ledger.groups()
            for sibling in record.siblings
            if sibling.attempts[-1].status.value == SEALED
            for key in sibling.attempts[-1].staging_keys
        }
        from_model = {key for group in self.model.values() for keys in group.keys for key in keys}
        assert self.ledger.expected_staging_keys() == from_records == from_model

    @invariant()
    def state_round_trips(self) -> None:
        state = self.ledger.state_dict()
        assert RolloutRecoveryLedger.from_state_dict(state).state_dict() == state

    @invariant()
    def checkpoint_safety_matches_finalizing_groups(self) -> None:
        finalizing = any(group.status == FINALIZING for group in self.model.values())
        try:
            self.ledger.assert_checkpoint_safe()
        except CheckpointUnsafeError:
            assert finalizing
        else:
            assert not finalizing


LedgerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerStateMachine = LedgerMachine.TestCase
