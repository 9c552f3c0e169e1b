"""Fixtures shared by every test directory."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SmallFilesystem = Callable[[int], Path]
"""Mounts a tmpfs of the given size (bytes) and returns its directory."""


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[SmallFilesystem]:
    """A real, small filesystem that fills up: a ``tmpfs`` of a few MB.

    Skipped, with the reason ``mount`` gave, where this machine does not allow
    mounting (not root, or a container without the capability). Every
    filesystem mounted is unmounted at the end, whatever the test did.
    """
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        directory = tmp_path / f"small_fs_{len(mounted)}"
        directory.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(directory)
        return directory

    try:
        yield mount
    finally:
        for directory in reversed(mounted):
            # Lazy: a file a failed test left open must not keep the mount alive.
            subprocess.run(["umount", "--lazy", str(directory)], check=True)
