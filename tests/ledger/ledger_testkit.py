"""Shared helpers of the ledger tests: a ledger, its cut, and an event loop to hold the cut on.

Ledger mutators are plain methods that require the calling task to hold a
mutation section; :meth:`Harness.mutate` runs one call inside
``async with cut.mutation():`` on a persistent event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from rollvault.rollout_recovery import (
    DataPlaneMutationCut,
    DatumSpec,
    PromptGroupRecoveryRecord,
    RecoveryGranularity,
    RolloutAttemptStatus,
    RolloutRecoveryLedger,
)

T = TypeVar("T")


def payload(idx: int = 7, task_name: str | None = "math") -> DatumSpec:
    datum: DatumSpec = {"idx": idx, "prompt_text": f"prompt {idx}", "prompt_token_ids": [1, idx]}
    if task_name is not None:
        datum["task_name"] = task_name
    return datum


def receipt_for(gate_rollout_id: str, keys: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "gate_rollout_id": gate_rollout_id,
        "staging_keys": [f"{gate_rollout_id}/call{k}" for k in range(keys)],
        **extra,
    }


def current_statuses(record: PromptGroupRecoveryRecord) -> list[RolloutAttemptStatus]:
    return [sibling.attempts[-1].status for sibling in record.siblings]


class Harness:
    """A ledger, its cut and a loop; mutations run inside a cut mutation section."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.cut = DataPlaneMutationCut()
        self.ledger = RolloutRecoveryLedger()
        self._next_idx = 100

    def close(self) -> None:
        self.loop.close()

    def mutate(self, call: Callable[[], T]) -> T:
        async def body() -> T:
            async with self.cut.mutation():
                return call()

        return self.loop.run_until_complete(body())

    def outside_cut(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the loop, in a task that holds no section."""

        async def body() -> T:
            return call()

        return self.loop.run_until_complete(body())

    # -- shortcuts for the common steps -----------------------------------------------------

    def reserve(
        self,
        siblings: int = 3,
        *,
        granularity: RecoveryGranularity = RecoveryGranularity.SIBLING,
        admitted: bool = True,
        idx: int | None = None,
        **kwargs: Any,
    ) -> str:
        if idx is None:
            idx = self._next_idx
            self._next_idx += 1
        kwargs.setdefault("target_step", 4)
        kwargs.setdefault("start_weight_version", 2)
        record = self.mutate(
            lambda: self.ledger.reserve_group(
                self.cut,
                prompt_id=str(idx),
                prompt_payload=payload(idx),
                expected_generations=siblings,
                recovery_granularity=granularity,
                admitted=admitted,
                **kwargs,
            )
        )
        return record.group_id

    def group(self, group_id: str) -> PromptGroupRecoveryRecord:
        return self.ledger.get_group(group_id)

    def gate_id(self, group_id: str, index: int) -> str:
        return self.group(group_id).gate_rollout_id(index)

    def dispatch(self, group_id: str, indices: list[int] | None = None) -> None:
        self.mutate(
            lambda: self.ledger.mark_group_dispatched(
                self.cut, group_id, generation_indices=indices
            )
        )

    def seal(self, group_id: str, index: int, *, reward: float = 1.0, keys: int = 1) -> None:
        gate = self.gate_id(group_id, index)
        self.mutate(
            lambda: self.ledger.mark_sibling_sealed(
                self.cut,
                group_id,
                generation_index=index,
                gate_rollout_id=gate,
                receipt=receipt_for(gate, keys),
                reward=reward,
                mask_sample=False,
            )
        )

    def fail(self, group_id: str, index: int, reason: str = "gate crashed") -> None:
        gate = self.gate_id(group_id, index)
        self.mutate(
            lambda: self.ledger.mark_sibling_failed(
                self.cut, group_id, generation_index=index, gate_rollout_id=gate, reason=reason
            )
        )

    def seal_all(self, group_id: str) -> None:
        for index in range(len(self.group(group_id).siblings)):
            self.seal(group_id, index, reward=float(index))

    def ready_group(self, siblings: int = 3, **kwargs: Any) -> str:
        group_id = self.reserve(siblings, **kwargs)
        self.dispatch(group_id)
        self.seal_all(group_id)
        return group_id

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a cut-taking ledger method inside a mutation section."""
        return self.mutate(lambda: getattr(self.ledger, method)(self.cut, *args, **kwargs))
