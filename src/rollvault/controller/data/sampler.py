"""The sampler: dispatch cursor plus the staleness policy, as pure logic.

``in_order`` stamps the k-th admitted group with ``target_step = k //
num_prompts_per_step``, admits a group stamped S only while ``S <=
trainer_version + max_lookahead_versions``, and the trainer takes step S only
from groups stamped S. ``windowed`` stamps nothing; the trainer takes any
group whose weights are at most ``max_staleness_versions`` behind it.

Both keep the same persisted cursor, :class:`SamplerState`. The pumps wait on
the trainer version themselves; a sampler only answers and counts.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Annotated, Protocol

import msgspec

from rollvault.config.schema import SamplerConfig, SamplerKind

__all__ = [
    "InOrderSampler",
    "Sampler",
    "SamplerAdmissionError",
    "SamplerState",
    "SamplerStateError",
    "WindowedSampler",
    "build_sampler",
]

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class SamplerAdmissionError(RuntimeError):
    """An admission or restamp the policy does not allow; nothing was counted."""


class SamplerStateError(ValueError):
    """A sampler state or restored target step that does not fit this sampler."""


class SamplerState(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The persisted sampler cursor.

    ``epoch``: highest dataset epoch among dispatched prompts.
    ``sampler_dispatch_index``: prompt groups dispatched (fresh and replacements).
    ``next_stamp_index``: target-step slots handed out; ``in_order`` only, since a
    replacement reuses its dropped group's slot.
    """

    kind: SamplerKind
    epoch: NonNegativeInt
    sampler_dispatch_index: NonNegativeInt
    next_stamp_index: NonNegativeInt


class Sampler(Protocol):
    """What the rollout pump, the train pump and restore need from either sampler."""

    @property
    def kind(self) -> SamplerKind: ...

    @property
    def stamps_target_steps(self) -> bool: ...

    @property
    def sampler_dispatch_index(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    def ready_to_admit(self, trainer_version: int) -> bool: ...

    def admit(self, *, epoch: int, trainer_version: int) -> int | None: ...

    def restamp(
        self, target_step: int | None, *, epoch: int, trainer_version: int
    ) -> int | None: ...

    def check_cursor_covers(self, target_steps: Iterable[int | None]) -> None: ...

    def state_dict(self) -> SamplerState: ...

    def load_state_dict(self, state: SamplerState) -> None: ...


class _Cursor(abc.ABC):
    """Dispatch counters shared by both samplers."""

    kind: SamplerKind

    def __init__(self) -> None:
        self._epoch = 0
        self._dispatch_index = 0
        self._next_stamp_index = 0

    @property
    def epoch(self) -> int:
        """Highest dataset epoch among dispatched prompts."""
        return self._epoch

    @property
    def sampler_dispatch_index(self) -> int:
        """Prompt groups dispatched so far, replacements included."""
        return self._dispatch_index

    def state_dict(self) -> SamplerState:
        """The cursor (immutable, so it never aliases live state)."""
        return SamplerState(
            kind=self.kind,
            epoch=self._epoch,
            sampler_dispatch_index=self._dispatch_index,
            next_stamp_index=self._next_stamp_index,
        )

    def load_state_dict(self, state: SamplerState) -> None:
        """Resume at ``state``; a state of the other sampler kind is rejected."""
        if state.kind is not self.kind:
            raise SamplerStateError(
                f"SamplerState.kind is {state.kind.value!r} but this run's sampler is "
                f"{self.kind.value!r}; a checkpoint's stamps only mean something to the "
                "sampler that wrote them"
            )
        self._check_counters(state)
        self._epoch = state.epoch
        self._dispatch_index = state.sampler_dispatch_index
        self._next_stamp_index = state.next_stamp_index

    @abc.abstractmethod
    def _check_counters(self, state: SamplerState) -> None:
        """Raise :class:`SamplerStateError` if the counters break this sampler's rules."""

    def _count_dispatch(self, epoch: int) -> None:
        self._epoch = max(self._epoch, epoch)
        self._dispatch_index += 1


def _require_non_negative(operation: str, **values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{operation}: {name} must be >= 0, got {value}")


class InOrderSampler(_Cursor):
    """Stamps groups with target steps and bounds how far ahead of the trainer they run."""

    kind = SamplerKind.IN_ORDER

    def __init__(self, num_prompts_per_step: int, max_lookahead_versions: int) -> None:
        super().__init__()
        if num_prompts_per_step < 1:
            raise ValueError(f"num_prompts_per_step must be >= 1, got {num_prompts_per_step}")
        _require_non_negative("InOrderSampler", max_lookahead_versions=max_lookahead_versions)
        self._per_step = num_prompts_per_step
        self._lookahead = max_lookahead_versions

    @property
    def stamps_target_steps(self) -> bool:
        """True: the ledger sidecar records that groups carry target steps."""
        return True

    @property
    def next_stamp_index(self) -> int:
        """Target-step slots handed out so far."""
        return self._next_stamp_index

    @property
    def next_target_step(self) -> int:
        """The step the next fresh admission would be stamped with."""
        return self._next_stamp_index // self._per_step

    def admissible(self, target_step: int, trainer_version: int) -> bool:
        """Whether a group stamped ``target_step`` may run at ``trainer_version``."""
        return target_step <= trainer_version + self._lookahead

    def ready_to_admit(self, trainer_version: int) -> bool:
        """Whether the next fresh admission is within the lookahead."""
        return self.admissible(self.next_target_step, trainer_version)

    def admit(self, *, epoch: int, trainer_version: int) -> int:
        """Stamp and count one fresh group; returns its target step."""
        _require_non_negative("InOrderSampler.admit", epoch=epoch, trainer_version=trainer_version)
        target_step = self.next_target_step
        if not self.admissible(target_step, trainer_version):
            raise SamplerAdmissionError(
                f"InOrderSampler.admit: step {target_step} is beyond trainer_version "
                f"{trainer_version} + max_lookahead_versions {self._lookahead}; wait for the "
                "trainer (ready_to_admit)"
            )
        self._next_stamp_index += 1
        self._count_dispatch(epoch)
        return target_step

    def restamp(self, target_step: int | None, *, epoch: int, trainer_version: int) -> int:
        """Give a replacement the dropped group's ``target_step``; counts a dispatch only."""
        _require_non_negative(
            "InOrderSampler.restamp", epoch=epoch, trainer_version=trainer_version
        )
        if target_step is None or not self.covers(target_step):
            raise SamplerAdmissionError(
                f"InOrderSampler.restamp: target step {target_step} was never handed out "
                f"(next fresh step is {self.next_target_step}); only a dropped group's stamp "
                "can be reused"
            )
        if target_step < trainer_version:
            raise SamplerAdmissionError(
                f"InOrderSampler.restamp: step {target_step} is already trained "
                f"(trainer_version {trainer_version}); a replacement for it would never train"
            )
        self._count_dispatch(epoch)
        return target_step

    def covers(self, target_step: int) -> bool:
        """Whether a slot of ``target_step`` has been handed out."""
        return target_step >= 0 and target_step * self._per_step < self._next_stamp_index

    def check_cursor_covers(self, target_steps: Iterable[int | None]) -> None:
        """Require every restored target step to be one this cursor already handed out.

        ``None`` (a reserved, not yet admitted group) needs no slot.
        """
        for step in target_steps:
            if step is not None and not self.covers(step):
                raise SamplerStateError(
                    f"restored target step {step} is not covered by the sampler cursor "
                    f"(next_stamp_index {self._next_stamp_index}, {self._per_step} prompts "
                    f"per step: steps 0..{self.next_target_step - 1} fully or partly stamped"
                    "); the snapshot's sampler state and ledger disagree"
                )

    def _check_counters(self, state: SamplerState) -> None:
        if state.next_stamp_index > state.sampler_dispatch_index:
            raise SamplerStateError(
                f"SamplerState.next_stamp_index ({state.next_stamp_index}) exceeds "
                f"SamplerState.sampler_dispatch_index ({state.sampler_dispatch_index}): "
                "every stamp is a dispatch"
            )


class WindowedSampler(_Cursor):
    """No stamps; the trainer takes groups whose weights are recent enough."""

    kind = SamplerKind.WINDOWED

    def __init__(self, max_staleness_versions: int) -> None:
        super().__init__()
        _require_non_negative("WindowedSampler", max_staleness_versions=max_staleness_versions)
        self._max_staleness = max_staleness_versions

    @property
    def stamps_target_steps(self) -> bool:
        """False: groups carry no target step."""
        return False

    @property
    def max_staleness_versions(self) -> int:
        """How many versions behind the trainer a group's weights may be."""
        return self._max_staleness

    def trainable(self, start_weight_version: int, trainer_version: int) -> bool:
        """Whether a group generated from ``start_weight_version`` may train now."""
        if start_weight_version > trainer_version:
            raise ValueError(
                f"WindowedSampler.trainable: start_weight_version {start_weight_version} is "
                f"ahead of trainer_version {trainer_version}; weights cannot come from the future"
            )
        return trainer_version - start_weight_version <= self._max_staleness

    def ready_to_admit(self, trainer_version: int) -> bool:
        """Always: only the pumps' semaphores bound a windowed run's admissions."""
        return True

    def admit(self, *, epoch: int, trainer_version: int) -> None:
        """Count one fresh group; windowed groups get no target step."""
        _require_non_negative("WindowedSampler.admit", epoch=epoch, trainer_version=trainer_version)
        self._count_dispatch(epoch)

    def restamp(self, target_step: int | None, *, epoch: int, trainer_version: int) -> None:
        """Count a replacement; there is no stamp to reuse."""
        if target_step is not None:
            raise SamplerAdmissionError(
                f"WindowedSampler.restamp: got target step {target_step}, but a windowed "
                "sampler never stamps groups"
            )
        self.admit(epoch=epoch, trainer_version=trainer_version)

    def check_cursor_covers(self, target_steps: Iterable[int | None]) -> None:
        """Require every restored group to be unstamped."""
        stamped = sorted({step for step in target_steps if step is not None})
        if stamped:
            raise SamplerStateError(
                f"restored groups carry target steps {stamped}, but this run's sampler is "
                "windowed and never stamps"
            )

    def _check_counters(self, state: SamplerState) -> None:
        if state.next_stamp_index != 0:
            raise SamplerStateError(
                f"SamplerState.next_stamp_index is {state.next_stamp_index}; a windowed "
                "sampler hands out no stamps, so it must be 0"
            )


def build_sampler(config: SamplerConfig, *, num_prompts_per_step: int) -> Sampler:
    """The sampler a run config asks for."""
    if config.kind is SamplerKind.IN_ORDER:
        return InOrderSampler(num_prompts_per_step, config.max_lookahead_versions)
    return WindowedSampler(config.max_staleness_versions)
