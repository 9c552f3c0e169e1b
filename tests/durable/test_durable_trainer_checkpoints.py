"""Trainer checkpoint directories: atomic publication, latest, pruning, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from child_zygote import Zygote

from rollvault.durable import trainer_checkpoints
from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.trainer_checkpoints import (
    TRAINER_DIGESTS_FILENAME,
    latest_trainer_checkpoint,
    prune_trainer_checkpoints,
    publish_trainer_checkpoint,
    trainer_checkpoint_path,
    trainer_checkpoint_steps,
    verify_trainer_checkpoint,
)


def _write_state(step: int) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        (directory / "trainer").mkdir()
        (directory / "trainer" / "state.bin").write_bytes(bytes([step % 256]) * 4096)
        (directory / "done").write_text(str(step))

    return write


def _complete(path: Path, step: int) -> bool:
    state = path / "trainer" / "state.bin"
    return (
        state.exists()
        and state.read_bytes() == bytes([step % 256]) * 4096
        and (path / "done").read_text() == str(step)
    )


def test_publish_latest_and_prune(tmp_path: Path) -> None:
    assert latest_trainer_checkpoint(tmp_path) is None
    for step in (10, 20, 30):
        path = publish_trainer_checkpoint(tmp_path, step, _write_state(step))
        assert path == trainer_checkpoint_path(tmp_path, step) and _complete(path, step)
    assert trainer_checkpoint_steps(tmp_path) == [10, 20, 30]
    assert latest_trainer_checkpoint(tmp_path) == 30
    assert prune_trainer_checkpoints(tmp_path, keep_latest=2) == [10]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_20", "step_30"]


def test_a_failing_write_leaves_nothing_and_earlier_checkpoints_untouched(tmp_path: Path) -> None:
    publish_trainer_checkpoint(tmp_path, 10, _write_state(10))

    def failing(directory: Path) -> None:
        (directory / "half").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(SnapshotWriteError, match="step_20 failed.*No space left"):
        publish_trainer_checkpoint(tmp_path, 20, failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10"]
    assert _complete(tmp_path / "step_10", 10)


def test_an_existing_step_is_never_overwritten(tmp_path: Path) -> None:
    publish_trainer_checkpoint(tmp_path, 10, _write_state(10))
    with pytest.raises(SnapshotWriteError, match="already exists"):
        publish_trainer_checkpoint(tmp_path, 10, _write_state(11))
    assert _complete(tmp_path / "step_10", 10)


def test_keep_latest_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_latest must be >= 1"):
        prune_trainer_checkpoints(tmp_path, keep_latest=0)


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from rollvault.durable.trainer_checkpoints import publish_trainer_checkpoint, prune_trainer_checkpoints
    def main():
        root, step = Path(sys.argv[1]), int(sys.argv[2])
        def write(directory):
            (directory / "trainer").mkdir()
            (directory / "trainer" / "state.bin").write_bytes(bytes([step % 256]) * 4096)
            (directory / "done").write_text(str(step))
        publish_trainer_checkpoint(root, step, write)
        prune_trainer_checkpoints(root, keep_latest=1)
    if __name__ == "__main__":
        main()
    """
)
"""The child script; forked per run from one process that imported it (``child_zygote``)."""


def _child(
    zygote: Zygote, root: Path, step: int, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return zygote.run([str(root), str(step)], {**os.environ, **env})


@pytest.mark.slow
def test_kill_at_every_fault_point_leaves_old_or_new_complete(tmp_path: Path) -> None:
    script = tmp_path / "trainer_checkpoint_child.py"
    script.write_text(CHILD)
    with Zygote(script) as zygote:
        _kill_at_every_fault_point(zygote, tmp_path)


def _kill_at_every_fault_point(zygote: Zygote, tmp_path: Path) -> None:
    template = tmp_path / "template"
    assert _child(zygote, template, 1, {}).returncode == 0
    trace = tmp_path / "trace.txt"
    traced = tmp_path / "traced"
    subprocess.run(["cp", "-a", str(template), str(traced)], check=True)
    assert _child(zygote, traced, 2, {"ROLLVAULT_FAULT_TRACE": str(trace)}).returncode == 0
    points = trace.read_text().split()
    assert (
        "trainer_checkpoint.after_rename" in points and "trainer_prune.after_trash_rename" in points
    )
    seen: dict[str, int] = {}
    for number, point in enumerate(points):
        seen[point] = seen.get(point, 0) + 1
        root = tmp_path / f"kill_{number}"
        subprocess.run(["cp", "-a", str(template), str(root)], check=True)
        killed = _child(zygote, root, 2, {"ROLLVAULT_FAULT_KILL_AT": f"{point}:{seen[point]}"})
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr)
        latest = latest_trainer_checkpoint(root)
        assert latest in (1, 2), point
        assert _complete(trainer_checkpoint_path(root, latest), latest), point
        # The next publication clears leftovers and succeeds.
        assert _child(zygote, root, 3, {}).returncode == 0, point
        assert trainer_checkpoint_steps(root) == [3]
        assert not [p for p in root.iterdir() if p.name.startswith(("tmp_", "trash_"))]


def test_publication_records_a_digest_of_every_file(tmp_path: Path) -> None:
    path = publish_trainer_checkpoint(tmp_path, 3, _write_state(3))
    assert verify_trainer_checkpoint(path) == []
    recorded = msgspec.json.decode((path / TRAINER_DIGESTS_FILENAME).read_bytes())
    assert sorted(recorded["files"]) == ["done", "trainer/state.bin"]


def test_a_flipped_byte_in_the_weights_is_named(tmp_path: Path) -> None:
    path = publish_trainer_checkpoint(tmp_path, 3, _write_state(3))
    state = path / "trainer" / "state.bin"
    data = bytearray(state.read_bytes())
    data[100] ^= 0x10
    state.write_bytes(bytes(data))
    assert verify_trainer_checkpoint(path) == [(state, "content changed (digest mismatch)")]


def test_missing_extra_and_undigested_files_are_named(tmp_path: Path) -> None:
    path = publish_trainer_checkpoint(tmp_path, 3, _write_state(3))
    (path / "done").unlink()
    (path / "trainer" / "stray.bin").write_bytes(b"x")
    assert verify_trainer_checkpoint(path) == [
        (path / "done", "missing"),
        (path / "trainer" / "stray.bin", f"not in {TRAINER_DIGESTS_FILENAME}"),
    ]
    (path / TRAINER_DIGESTS_FILENAME).write_bytes(b'{"schema_version": 1}')
    [(where, problem)] = verify_trainer_checkpoint(path)
    assert where == path / TRAINER_DIGESTS_FILENAME
    assert "unreadable" in problem and "files" in problem
    (path / TRAINER_DIGESTS_FILENAME).unlink()
    assert verify_trainer_checkpoint(path) == [
        (path / TRAINER_DIGESTS_FILENAME, "missing, so the checkpoint's files cannot be checked")
    ]


def test_rollout_snapshots_written_after_publication_are_not_trainer_files(tmp_path: Path) -> None:
    path = publish_trainer_checkpoint(tmp_path, 3, _write_state(3))
    later = path / "rollout_snapshots" / "snapshot_000001"
    later.mkdir(parents=True)
    (later / "manifest.json").write_text("{}")
    assert verify_trainer_checkpoint(path) == []


def test_leftovers_are_cleared_before_anything_is_written(tmp_path: Path) -> None:
    publish_trainer_checkpoint(tmp_path, 10, _write_state(10))
    for name in ("tmp_step_20", "trash_step_5"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(b"w" * 4096)
    seen: list[list[str]] = []

    def write(directory: Path) -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        _write_state(20)(directory)

    publish_trainer_checkpoint(tmp_path, 20, write)
    assert seen == [["step_10", "tmp_step_20"]]  # tmp_step_20 is the new one, empty
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10", "step_20"]


def test_a_failed_cleanup_after_a_failed_write_keeps_the_write_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    publish_trainer_checkpoint(tmp_path, 10, _write_state(10))

    def full(directory: Path) -> None:
        raise OSError(28, "No space left on device")

    def failing_remove(path: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(trainer_checkpoints, "remove_tree", failing_remove)
    with pytest.raises(SnapshotWriteError, match="step_20 failed.*No space left"):
        publish_trainer_checkpoint(tmp_path, 20, full)
    assert "could not remove unpublished trainer checkpoint" in caplog.text
    assert "Input/output error" in caplog.text
    assert _complete(tmp_path / "step_10", 10)


def test_on_a_full_filesystem_a_failed_checkpoint_leaves_the_previous_one_intact(
    small_filesystem: Callable[[int], Path],
) -> None:
    root = small_filesystem(1 << 20) / "ckpt"
    publish_trainer_checkpoint(root, 10, _write_state(10))

    def big(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(os.urandom(2 << 20))

    with pytest.raises(SnapshotWriteError, match="step_20 failed.*No space left on device"):
        publish_trainer_checkpoint(root, 20, big)
    assert trainer_checkpoint_steps(root) == [10]
    assert _complete(root / "step_10", 10) and verify_trainer_checkpoint(root / "step_10") == []
    assert sorted(p.name for p in root.iterdir()) == ["step_10"]
    publish_trainer_checkpoint(root, 20, _write_state(20))
    assert trainer_checkpoint_steps(root) == [10, 20]
