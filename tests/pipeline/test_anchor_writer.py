"""AnchorWriter: one writer per anchor, a restore's seed used only for its own anchor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rollvault.controller.snapshots.anchor_writer import AnchorWriter


@dataclass
class _Writer:
    segments_dir: Path
    seeded: bool = False


@dataclass
class _Seed:
    segments_dir: Path
    made: list[_Writer] = field(default_factory=list)

    def writer(self) -> _Writer:
        self.made.append(_Writer(self.segments_dir, seeded=True))
        return self.made[-1]


def test_the_writer_is_kept_for_its_anchor_and_replaced_when_the_anchor_changes() -> None:
    writers = AnchorWriter(_Writer)
    first = writers.for_segments(Path("a"))
    assert writers.for_segments(Path("a")) is first and not first.seeded
    second = writers.for_segments(Path("b"))
    assert second is not first and second.segments_dir == Path("b")


def test_a_seed_starts_the_writer_of_its_own_anchor_once() -> None:
    writers = AnchorWriter(_Writer)
    seed = _Seed(Path("a"))
    writers.seed(seed)
    seeded = writers.for_segments(Path("a"))
    assert seeded.seeded and seed.made == [seeded]
    # Back to the anchor after another one: the seed was used up, every row is new again.
    writers.for_segments(Path("b"))
    assert not writers.for_segments(Path("a")).seeded and len(seed.made) == 1


def test_a_seed_of_another_anchor_is_dropped() -> None:
    # A restore from a trainer checkpoint's own snapshot, whose next snapshot goes to a
    # new anchor: nothing the restore loaded is referenced there.
    writers = AnchorWriter(_Writer)
    seed = _Seed(Path("trainer_step_10"))
    writers.seed(seed)
    assert not writers.for_segments(Path("anchor")).seeded
    assert not writers.for_segments(Path("trainer_step_10")).seeded and seed.made == []
