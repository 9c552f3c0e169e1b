"""The trainer's weights as one directory per version, for servers to reload from.

Version ``N`` lives in ``<root>/v<N:08d>/model.safetensors``, published whole
through :func:`rollvault.durable.published_dirs.publish_directory` (written
into ``tmp_v…``, flushed, renamed): a server never reads a half-written file,
and a crash leaves the previous version intact. Only the newest
``keep`` versions stay; older ones are deleted once a newer one is in place
(a restarted server needs only the current one). ``root`` must be a path the
servers can read: local, or a shared filesystem for servers on other machines.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from rollvault.durable.published_dirs import publish_directory
from rollvault.durable.trash import remove_tree

__all__ = ["WEIGHTS_FILENAME", "WeightDirs"]

WEIGHTS_FILENAME: Final = "model.safetensors"
_VERSION_DIR = re.compile(r"v(\d{8})")


class WeightDirs:
    """Publishes and prunes ``<root>/v<N>/`` directories (see the module docstring)."""

    def __init__(self, root: Path, *, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"WeightDirs: keep must be >= 1, got {keep}")
        self.root = root
        self._keep = keep

    def path(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def publish(self, version: int, weights: bytes) -> Path:
        """Write ``weights`` (safetensors bytes) as version ``version``; prune old versions."""

        def write(directory: Path) -> None:
            (directory / WEIGHTS_FILENAME).write_bytes(weights)

        published = publish_directory(self.path(version).resolve(), write)
        self.prune()
        return published

    def versions(self) -> list[int]:
        """The versions published under ``root``, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_VERSION_DIR.fullmatch(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(match.group(1)) for match in found if match is not None)

    def prune(self) -> list[int]:
        """Delete all but the newest ``keep`` versions; return the ones deleted."""
        old = self.versions()[: -self._keep]
        for version in old:
            remove_tree(self.path(version))
        return old
