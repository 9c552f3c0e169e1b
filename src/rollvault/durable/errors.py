"""Errors of the durable layer.

Every failure of the filesystem contract (a bad or missing manifest, a failed
write, an incompatible run, no usable snapshot) is a ``SnapshotError``.
Callers that must survive a failed snapshot (the periodic checkpointer) catch
it; callers that must refuse to resume catch ``IncompatibleRunError`` and show
its message, which lists every difference. Misuse of an argument (a
``keep_latest_k`` of 0, a config value JSON cannot hold) raises ``ValueError``
or ``TypeError`` instead: it is a bug to fix, not a condition to survive.
"""

from __future__ import annotations

from pathlib import Path


class SnapshotError(Exception):
    """Base of every error raised by the durable snapshot layer."""


class SnapshotManifestError(SnapshotError, ValueError):
    """A manifest (snapshot or bootstrap anchor) is missing, unreadable or malformed."""


class SnapshotWriteError(SnapshotError):
    """Writing, flushing or publishing a snapshot failed.

    The temporary directory has been removed and every previously committed
    snapshot is untouched, so the caller may log this and carry on.
    """


class SnapshotLayoutError(SnapshotError, ValueError):
    """A path handed to the layer is not the kind of snapshot path it must be."""


class IncompatibleRunError(SnapshotError):
    """The run's compatibility identity differs from the one a checkpoint was made under.

    ``differences`` holds one line per changed leaf (``dotpath: old -> new``).
    """

    def __init__(self, anchor: Path, differences: list[str]) -> None:
        self.anchor = anchor
        self.differences = list(differences)
        listing = "\n".join(f"  - {line}" for line in self.differences)
        super().__init__(
            f"refusing to resume from {anchor}: the run's configuration differs from "
            f"the one the checkpoint was made under in {len(self.differences)} "
            f"place(s) (checkpoint value -> this run's value):\n{listing}"
        )


class DatasetChangedError(IncompatibleRunError):
    """The run's dataset differs, row by row, from the one its bootstrap anchor recorded.

    ``differences`` holds one line per finding: the row count, or a changed
    row with where it is (a file and a line, when the dataset can say).
    """

    def __init__(self, anchor: Path, differences: list[str]) -> None:
        self.anchor = anchor
        self.differences = list(differences)
        listing = "\n".join(f"  - {line}" for line in self.differences)
        # Not IncompatibleRunError's wording: the config is unchanged, the data is not.
        SnapshotError.__init__(
            self,
            f"refusing to resume from {anchor}: the dataset differs from the one the run "
            f"started with (the rows a snapshot refers to by index would be other prompts):"
            f"\n{listing}",
        )


class NoUsableSnapshotError(SnapshotError):
    """Committed snapshots exist under an anchor but none of them can be used.

    ``rejected`` holds ``(path, reason)`` for every committed snapshot, newest first.
    """

    def __init__(self, anchor: Path, rejected: list[tuple[Path, str]]) -> None:
        self.anchor = anchor
        self.rejected = list(rejected)
        listing = "\n".join(f"  - {path}: {reason}" for path, reason in self.rejected)
        super().__init__(
            f"no usable rollout snapshot under {anchor}: all {len(self.rejected)} "
            f"committed snapshot(s) were rejected:\n{listing}"
        )
