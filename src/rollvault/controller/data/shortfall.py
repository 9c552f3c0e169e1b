"""Permanently lost groups: batch shortfall per target step, and the spare-prompt reserve.

When a group exhausts its retry budget, the controller either replaces it
with a spare prompt that takes the same target step (``on_dropped_prompt:
replace``) or records it as shortfall of that step, which then trains on fewer
groups (``shrink``). A step never shrinks below its floor,
``ceil(num_prompts_per_step * min_step_batch_fraction)``: past that the
controller must replace instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Annotated

import msgspec

__all__ = [
    "SHORTFALL_SCHEMA_VERSION",
    "SPARE_PROMPTS_SCHEMA_VERSION",
    "BatchShortfall",
    "BatchShortfallState",
    "ShortfallError",
    "SparePrompt",
    "SparePrompts",
    "SparePromptsError",
    "SparePromptsState",
    "step_floor",
]

SHORTFALL_SCHEMA_VERSION = 1
SPARE_PROMPTS_SCHEMA_VERSION = 1

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class ShortfallError(ValueError):
    """A shortfall operation or state that breaks its rules; nothing changed."""


class SparePromptsError(ValueError):
    """A spare-prompt operation or state that breaks its rules; nothing changed."""


def step_floor(num_prompts_per_step: int, min_step_batch_fraction: float) -> int:
    """The fewest groups a step may train on: ``ceil(n * fraction)``, at least 1."""
    if num_prompts_per_step < 1:
        raise ShortfallError(f"num_prompts_per_step must be >= 1, got {num_prompts_per_step}")
    if not 0.0 < min_step_batch_fraction <= 1.0:
        raise ShortfallError(
            f"min_step_batch_fraction must be in (0, 1], got {min_step_batch_fraction}"
        )
    # Rounding first keeps 10 * 0.3 == 3.0000000000000004 from becoming 4.
    return max(1, math.ceil(round(num_prompts_per_step * min_step_batch_fraction, 9)))


class BatchShortfallState(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Persisted shortfall: target step -> groups permanently lost from it."""

    schema_version: int
    losses: dict[NonNegativeInt, PositiveInt]


class BatchShortfall:
    """Per target step, how many prompt groups were permanently lost."""

    def __init__(self) -> None:
        self._losses: dict[int, int] = {}

    def lost(self, step: int) -> int:
        """Groups recorded lost from ``step``."""
        return self._losses.get(step, 0)

    @property
    def total_lost(self) -> int:
        """Groups recorded lost over all steps."""
        return sum(self._losses.values())

    def record_loss(self, step: int) -> int:
        """Record one more group lost from ``step``; returns the step's new loss count.

        Call it only after :meth:`can_shrink` said yes; otherwise replace the group.
        """
        if step < 0:
            raise ShortfallError(f"BatchShortfall.record_loss: step must be >= 0, got {step}")
        self._losses[step] = self.lost(step) + 1
        return self._losses[step]

    def required_groups(
        self, step: int, num_prompts_per_step: int, min_step_batch_fraction: float
    ) -> int:
        """Groups ``step`` trains on: the full batch minus its losses, never below the floor."""
        floor = step_floor(num_prompts_per_step, min_step_batch_fraction)
        return max(num_prompts_per_step - self.lost(step), floor)

    def can_shrink(
        self, step: int, num_prompts_per_step: int, min_step_batch_fraction: float
    ) -> bool:
        """Whether one more loss may shrink ``step`` without going below the floor."""
        floor = step_floor(num_prompts_per_step, min_step_batch_fraction)
        return num_prompts_per_step - self.lost(step) - 1 >= floor

    def as_dict(self) -> dict[int, int]:
        """A copy, in the shape the ledger sidecar's ``batch_shortfall`` takes."""
        return dict(self._losses)

    def state_dict(self) -> BatchShortfallState:
        """A copy of the losses (never aliases live state)."""
        return BatchShortfallState(schema_version=SHORTFALL_SCHEMA_VERSION, losses=self.as_dict())

    def load_state_dict(self, state: BatchShortfallState) -> None:
        """Fill this empty record from ``state``; problems are rejected before any change."""
        if self._losses:
            raise ShortfallError(
                "BatchShortfall.load_state_dict: losses are already recorded; restore loads "
                "into an empty record"
            )
        _check_schema(
            "BatchShortfallState", state.schema_version, SHORTFALL_SCHEMA_VERSION, ShortfallError
        )
        _revalidate(state, BatchShortfallState, ShortfallError)
        self._losses = dict(state.losses)


class SparePrompt(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One prompt pulled from the dataloader and held for a replacement."""

    epoch: NonNegativeInt
    dataset_idx: NonNegativeInt


class SparePromptsState(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Persisted reserve, oldest first."""

    schema_version: int
    prompts: tuple[SparePrompt, ...]


class SparePrompts:
    """The replacement reserve: a FIFO of ``(epoch, dataset_idx)`` pulled ahead.

    These prompts have left the dataloader but reached no ledger row, so the
    snapshot must carry them or they are lost. A prompt can be held only once.
    """

    def __init__(self) -> None:
        self._queue: deque[SparePrompt] = deque()
        self._held: set[SparePrompt] = set()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter([(spare.epoch, spare.dataset_idx) for spare in self._queue])

    def oldest_epoch(self) -> int | None:
        """Epoch of the oldest spare (None: the reserve is empty)."""
        return self._queue[0].epoch if self._queue else None

    def refill_count(self, num_spare_prompts: int) -> int:
        """How many prompts to pull from the dataloader to hold ``num_spare_prompts``."""
        return max(0, num_spare_prompts - len(self._queue))

    def push(self, epoch: int, dataset_idx: int) -> None:
        """Hold one more prompt (newest last)."""
        if epoch < 0 or dataset_idx < 0:
            raise SparePromptsError(
                f"SparePrompts.push: epoch and dataset_idx must be >= 0, got ({epoch}, {dataset_idx})"
            )
        spare = SparePrompt(epoch=epoch, dataset_idx=dataset_idx)
        if spare in self._held:
            raise SparePromptsError(
                f"SparePrompts.push: prompt (epoch {epoch}, dataset_idx {dataset_idx}) is "
                "already held; holding it twice would train it twice"
            )
        self._queue.append(spare)
        self._held.add(spare)

    def pop(self) -> tuple[int, int]:
        """Take the oldest spare as ``(epoch, dataset_idx)``."""
        if not self._queue:
            raise SparePromptsError("SparePrompts.pop: the reserve is empty")
        spare = self._queue.popleft()
        self._held.discard(spare)
        return spare.epoch, spare.dataset_idx

    def drain(self) -> list[tuple[int, int]]:
        """Take every spare, oldest first (nothing is left held)."""
        taken = list(self)
        self._queue.clear()
        self._held.clear()
        return taken

    def state_dict(self) -> SparePromptsState:
        """The reserve, oldest first (immutable, so nothing aliases live state)."""
        return SparePromptsState(
            schema_version=SPARE_PROMPTS_SCHEMA_VERSION, prompts=tuple(self._queue)
        )

    def load_state_dict(self, state: SparePromptsState) -> None:
        """Fill this empty reserve from ``state``; rejects duplicates before any change."""
        if self._queue:
            raise SparePromptsError(
                f"SparePrompts.load_state_dict: the reserve already holds {len(self)} prompts; "
                "restore loads into an empty reserve"
            )
        _check_schema(
            "SparePromptsState",
            state.schema_version,
            SPARE_PROMPTS_SCHEMA_VERSION,
            SparePromptsError,
        )
        _revalidate(state, SparePromptsState, SparePromptsError)
        first_seen: dict[SparePrompt, int] = {}
        for position, spare in enumerate(state.prompts):
            if spare in first_seen:
                raise SparePromptsError(
                    f"SparePromptsState.prompts[{position}]: duplicate (epoch {spare.epoch}, "
                    f"dataset_idx {spare.dataset_idx}), first at prompts[{first_seen[spare]}]"
                )
            first_seen[spare] = position
        self._queue = deque(state.prompts)
        self._held = set(state.prompts)


def _check_schema(name: str, found: int, supported: int, error: type[ValueError]) -> None:
    if found != supported:
        raise error(
            f"{name}.schema_version {found} is not supported (this build reads {supported})"
        )


def _revalidate(state: msgspec.Struct, cls: type[msgspec.Struct], error: type[ValueError]) -> None:
    """Re-check field constraints of a state that was built in Python, not decoded."""
    try:
        msgspec.convert(msgspec.to_builtins(state), type=cls, strict=True)
    except msgspec.ValidationError as exc:
        raise error(f"invalid {cls.__name__}: {exc}") from exc
