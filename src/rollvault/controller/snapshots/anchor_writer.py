"""One kind of segment writer (rows, ledger records or group facts) for the current anchor.

Snapshots of one anchor share its ``rollout_snapshots/segments/``, and each kind
of writer remembers what the anchor's last committed snapshot holds, so the
next one writes only what is new. When the anchor changes (a new trainer
checkpoint), everything is new again: a fresh writer. A restore hands over a
*seed*, what it loaded, so the first snapshot after a restart writes only what
the restart changed; it is used only if that snapshot goes to the anchor the
seed was loaded from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class _HasSegmentsDir(Protocol):
    @property
    def segments_dir(self) -> Path: ...


Writer = TypeVar("Writer", bound=_HasSegmentsDir)
_Made = TypeVar("_Made", bound=_HasSegmentsDir, covariant=True)


class WriterSeed(Protocol[_Made]):
    """What a restore loaded, able to make a writer that starts from it."""

    @property
    def segments_dir(self) -> Path: ...

    def writer(self) -> _Made: ...


class AnchorWriter(Generic[Writer]):
    """The writer of one kind for the anchor the next snapshot goes to."""

    def __init__(self, fresh: Callable[[Path], Writer]) -> None:
        self._fresh = fresh
        self._writer: Writer | None = None
        self._seed: WriterSeed[Writer] | None = None

    def seed(self, seed: WriterSeed[Writer] | None) -> None:
        """Start the next anchor's writer from ``seed`` if it was loaded from that anchor."""
        self._seed = seed

    def for_segments(self, segments_dir: Path) -> Writer:
        """The writer for ``segments_dir`` (the anchor's): a new one when the anchor changed."""
        if self._writer is None or self._writer.segments_dir != segments_dir:
            seed, self._seed = self._seed, None
            seeded = seed is not None and seed.segments_dir == segments_dir
            self._writer = (
                seed.writer() if seed is not None and seeded else self._fresh(segments_dir)
            )
        return self._writer
