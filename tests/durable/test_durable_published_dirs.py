"""Directories published and replaced whole: content, digests, failures, kills."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from child_zygote import Zygote

from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.published_dirs import publish_directory
from rollvault.durable.trainer_checkpoints import (
    TRAINER_DIGESTS_FILENAME,
    verify_trainer_checkpoint,
)


def _write_version(version: int) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(bytes([version % 256]) * 4096)
        (directory / "sub").mkdir()
        (directory / "sub" / "config.json").write_text(f'{{"version": {version}}}')

    return write


def _version(path: Path) -> int | None:
    """The version a complete directory holds; None when it is not complete."""
    weights, config = path / "weights.bin", path / "sub" / "config.json"
    if not (weights.is_file() and config.is_file()):
        return None
    data = weights.read_bytes()
    version = data[0]
    if data != bytes([version]) * 4096 or config.read_text() != f'{{"version": {version}}}':
        return None
    return version


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_a_directory_is_published_then_replaced_whole(tmp_path: Path) -> None:
    final = tmp_path / "run" / "final_model"
    assert publish_directory(final, _write_version(1)) == final
    assert _version(final) == 1 and _names(tmp_path / "run") == ["final_model"]
    assert not (final / TRAINER_DIGESTS_FILENAME).exists()
    publish_directory(final, _write_version(2))
    assert _version(final) == 2 and _names(tmp_path / "run") == ["final_model"]


def test_with_digests_every_file_is_recorded_and_checked(tmp_path: Path) -> None:
    final = publish_directory(tmp_path / "policy", _write_version(3), with_digests=True)
    assert verify_trainer_checkpoint(final) == []
    weights = final / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[7] ^= 0x01
    weights.write_bytes(bytes(data))
    assert verify_trainer_checkpoint(final) == [(weights, "content changed (digest mismatch)")]


def test_a_failing_write_leaves_the_old_directory_untouched(tmp_path: Path) -> None:
    final = publish_directory(tmp_path / "final_model", _write_version(1))

    def failing(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(SnapshotWriteError, match="final_model failed.*No space left.*untouched"):
        publish_directory(final, failing)
    assert _version(final) == 1 and _names(tmp_path) == ["final_model"]


def test_leftovers_of_a_killed_publication_are_cleared(tmp_path: Path) -> None:
    for leftover in ("tmp_final_model", "trash_final_model"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "weights.bin").write_bytes(b"stale")
    publish_directory(tmp_path / "final_model", _write_version(4))
    assert _names(tmp_path) == ["final_model"] and _version(tmp_path / "final_model") == 4


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from rollvault.durable.published_dirs import publish_directory
    def main():
        final, version = Path(sys.argv[1]), int(sys.argv[2])
        def write(directory):
            (directory / "weights.bin").write_bytes(bytes([version % 256]) * 4096)
            (directory / "sub").mkdir()
            (directory / "sub" / "config.json").write_text('{"version": %d}' % version)
        publish_directory(final, write, with_digests=True)
    if __name__ == "__main__":
        main()
    """
)
"""The child script; forked per run from one process that imported it (``child_zygote``)."""


def _child(
    zygote: Zygote, final: Path, version: int, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return zygote.run([str(final), str(version)], {**os.environ, **env})


@pytest.mark.slow
def test_kill_at_every_fault_point_never_leaves_a_partial_directory(tmp_path: Path) -> None:
    script = tmp_path / "publish_child.py"
    script.write_text(CHILD)
    with Zygote(script) as zygote:
        _kill_at_every_fault_point(zygote, tmp_path)


def _kill_at_every_fault_point(zygote: Zygote, tmp_path: Path) -> None:
    template = tmp_path / "template"
    assert _child(zygote, template / "final_model", 1, {}).returncode == 0
    trace = tmp_path / "trace.txt"
    traced = tmp_path / "traced"
    subprocess.run(["cp", "-a", str(template), str(traced)], check=True)
    env = {"ROLLVAULT_FAULT_TRACE": str(trace)}
    assert _child(zygote, traced / "final_model", 2, env).returncode == 0
    points = trace.read_text().split()
    assert "published_dir.old_trashed" in points and "published_dir.after_rename" in points
    seen: dict[str, int] = {}
    for number, point in enumerate(points):
        seen[point] = seen.get(point, 0) + 1
        root = tmp_path / f"kill_{number}"
        subprocess.run(["cp", "-a", str(template), str(root)], check=True)
        final = root / "final_model"
        killed = _child(zygote, final, 2, {"ROLLVAULT_FAULT_KILL_AT": f"{point}:{seen[point]}"})
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr)
        if final.exists():
            # Whatever is under the final name is complete: the old one or the new one.
            assert _version(final) in (1, 2), point
            assert verify_trainer_checkpoint(final) == [], point
        else:
            # Only between the two renames: both complete copies are still there.
            assert point == "published_dir.old_trashed", point
            assert _version(root / "tmp_final_model") == 2
            assert _version(root / "trash_final_model") == 1
        # The next publication clears every leftover and succeeds.
        assert _child(zygote, final, 3, {}).returncode == 0, point
        assert _names(root) == ["final_model"] and _version(final) == 3, point
