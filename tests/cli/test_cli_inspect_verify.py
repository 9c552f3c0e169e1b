"""``rollvault inspect`` and ``rollvault verify`` on checkpoint directories of real runs.

The runs are in-process with the simulated gate (tests/pipeline/pipeline_helpers):
one crashes after a trainer checkpoint (``step_4/`` with its ``rollout_state``
and rollout snapshots), one is killed with a sibling slot stuck before any
trainer step (snapshots under ``bootstrap/`` full of in-flight attempts). The
expected counts are read straight from the files with ``json``, not through
the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from pipeline_helpers import (  # noqa: E402
    run_stalled_then_kill,
    run_until_crash_holding_rows,
    small_config,
)
from snapshot_versions import read_sidecar  # noqa: E402

from rollvault.checkpoint_tools.inventory import (  # noqa: E402
    CheckpointInventory,
    CheckpointProblem,
    SnapshotEntry,
    ledger_of,
)
from rollvault.checkpoint_tools.verify import cross_reference_problems  # noqa: E402
from rollvault.cli.main import main  # noqa: E402
from rollvault.controller.snapshots.snapshot_files import (  # noqa: E402
    LoadedSnapshot,
    segments_dir_for,
)
from rollvault.controller.snapshots.verification import (  # noqa: E402
    ProblemKind,
    VerificationLevel,
    read_snapshot,
    verify_loaded_snapshot,
)
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint  # noqa: E402
from rollvault.dataplane.interface import (  # noqa: E402
    STAGING_PARTITION,
    TRAIN_PARTITION,
    staging_key,
)
from rollvault.dataplane.segmented import read_segmented_content  # noqa: E402
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, BOOTSTRAP_POLICY_DIRNAME  # noqa: E402
from rollvault.durable.manifest_schema import (  # noqa: E402
    encode_snapshot_manifest,
    read_snapshot_manifest,
)
from rollvault.durable.published_dirs import publish_directory  # noqa: E402
from rollvault.ledger.state_schema import LedgerState  # noqa: E402
from rollvault.ledger.statuses import RolloutAttemptStatus  # noqa: E402

SLOW_GATE = (
    "gate.simulated.latency_per_token_s=0.002",
    "rollout_checkpointing.interval_s=0.05",
    "checkpointing.save_period=4",
)
GENERATIONS = 4  # small_config's grpo.num_generations_per_prompt
SNAPSHOT_FILES = (
    "manifest.json",
    "rollout_recovery.json",
    "replay_buffer_metadata.json",
    "replacement_reserve.json",
    "controller_state.json",
    "data_plane/metadata.json",
    "segment:rollout_staging",
    "segment:train",
)
"""Files of a snapshot; ``segment:<partition>`` is a segment of that partition it references."""


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that died after step 6: step_4/ (trainer checkpoint, holding staged and train
    rows) and its snapshots."""
    root = tmp_path_factory.mktemp("trained")
    run_until_crash_holding_rows(small_config(root, *SLOW_GATE), 6)
    return root / "ckpt"


@pytest.fixture(scope="module")
def stalled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed before any step, sibling 3 of every group stuck: bootstrap snapshots."""
    root = tmp_path_factory.mktemp("stalled")
    run_stalled_then_kill(small_config(root, *SLOW_GATE), stalled_index=3)
    return root / "ckpt"


@pytest.fixture
def trained_copy(trained_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained_dir, tmp_path / "ckpt"))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def inspect_json(capsys: pytest.CaptureFixture[str], checkpoint_dir: Path) -> CheckpointInventory:
    code, out, _ = run_cli(capsys, "inspect", checkpoint_dir, "--json")
    assert code == 0
    return msgspec.json.decode(out, type=CheckpointInventory, strict=True)


def snapshot_dirs(checkpoint_dir: Path) -> set[Path]:
    """Every committed snapshot, found with a glob rather than the code under test."""
    found = set(checkpoint_dir.glob("step_*/rollout_state"))
    found |= set(checkpoint_dir.glob("*/rollout_snapshots/snapshot_*"))
    return found


def newest_rollout_snapshot(checkpoint_dir: Path) -> Path:
    return max(checkpoint_dir.glob("*/rollout_snapshots/snapshot_*"), key=lambda p: p.name)


def snapshot_file(directory: Path, name: str) -> Path:
    """``name`` in the snapshot at ``directory``; ``segment:<partition>`` the newest segment
    of that partition the snapshot references, or if it holds none of its rows, that an
    older snapshot beside it references (segments are shared by an anchor's snapshots).
    The fixtures make sure some snapshot holds rows of each partition."""
    if not name.startswith("segment:"):
        return directory / name
    partition = name.removeprefix("segment:")
    for snapshot in [directory, *sorted(directory.parent.glob("snapshot_*"), reverse=True)]:
        content = read_segmented_content(snapshot / "data_plane", segments_dir_for(snapshot))
        files = [r.file for r in content.segments if r.partition == partition]
        if files:
            return segments_dir_for(directory) / max(files)
    raise AssertionError(f"no snapshot beside {directory} holds {partition} rows")


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def counts_from_files(snapshot: Path) -> dict[str, Any]:
    """What inspect should report for ``snapshot``, read with the json module."""

    def load(name: str) -> Any:
        return json.loads((snapshot / name).read_text())

    manifest = load("manifest.json")
    groups = read_sidecar(snapshot)["ledger"]["groups"]  # version 6: from its ledger segments
    current = Counter(s["attempts"][-1]["status"] for g in groups for s in g["siblings"])
    rows: Counter[str] = Counter()
    # Version 4 lists segments as arrays, their sizes in catalogs: their held rows counted by
    # the data plane's reader.
    for segment in read_segmented_content(
        snapshot / "data_plane", segments_dir_for(snapshot)
    ).segments:
        rows[segment.partition] += segment.live_rows
    return {
        "step": manifest["base_train_step"],
        "mutation_version": manifest["mutation_version"],
        "rolled_back": manifest["rolled_back_train_group_count"],
        "groups": {k: v for k, v in Counter(g["status"] for g in groups).items() if v},
        # Version 3: the entries are replay facts, the file their order as (first, count) runs.
        "canonical": sum(count for _first, count in load("replay_buffer_metadata.json")["order"]),
        "sealed": current["sealed"],
        "in_flight": current["reserved"] + current["dispatched"],
        "staged": rows.get("rollout_staging", 0),
        "train": rows.get("train", 0),
        "spares": len(load("replacement_reserve.json")["prompts"]),
        "bytes": sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file()),
    }


def counts_from_entry(entry: SnapshotEntry) -> dict[str, Any]:
    assert entry.manifest is not None and entry.contents is not None and entry.damage is None
    contents = entry.contents
    return {
        "step": entry.manifest.base_train_step,
        "mutation_version": entry.manifest.mutation_version,
        "rolled_back": entry.manifest.rolled_back_train_group_count,
        "groups": {status.value: n for status, n in contents.groups_by_status.items() if n},
        "canonical": contents.canonical_groups,
        "sealed": contents.siblings.sealed,
        "in_flight": contents.siblings.in_flight,
        "staged": contents.staged_rows,
        "train": contents.train_rows,
        "spares": contents.spare_prompts,
        "bytes": entry.bytes_on_disk,
    }


# -- inspect ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["trained", "stalled"])
def test_inspect_json_lists_every_snapshot_with_the_counts_of_its_files(
    capsys: pytest.CaptureFixture[str], which: str, trained_dir: Path, stalled_dir: Path
) -> None:
    checkpoint_dir = trained_dir if which == "trained" else stalled_dir
    inventory = inspect_json(capsys, checkpoint_dir)
    entries = {Path(s.path): s for a in inventory.anchors for s in a.snapshots}
    assert set(entries) == snapshot_dirs(checkpoint_dir)
    # A stalled run may reach its stuck state before its second snapshot; after that
    # nothing changes, so no other snapshot is written (waiting for one would hang).
    assert len(entries) >= (2 if which == "trained" else 1)
    for path, entry in entries.items():
        assert counts_from_entry(entry) == counts_from_files(path), path


def test_inspect_json_describes_anchors_and_the_bootstrap_identity(
    capsys: pytest.CaptureFixture[str], trained_dir: Path, stalled_dir: Path
) -> None:
    trained = inspect_json(capsys, trained_dir)
    stored = json.loads((trained_dir / "bootstrap" / "manifest.json").read_text())
    assert trained.bootstrap.fingerprint == stored["fingerprint"]
    assert trained.bootstrap.generations_per_group == GENERATIONS
    assert trained.bootstrap.damage is None
    assert [(a.kind.value, a.step) for a in trained.anchors] == [
        ("bootstrap", 0),
        ("trainer_checkpoint", 4),
    ]
    bootstrap, step_4 = trained.anchors
    assert bootstrap.snapshots == []  # pruned once step_4/ exists
    assert step_4.trainer_state_bytes is not None and step_4.trainer_state_bytes > 0
    # The rows and ledger records its snapshots share, which no snapshot's own bytes count.
    shared = trained_dir / "step_4" / "rollout_snapshots" / "segments"
    assert step_4.shared_segment_bytes == sum(
        f.stat().st_size for f in shared.rglob("*") if f.is_file()
    )
    assert step_4.shared_segment_bytes > 0 and bootstrap.shared_segment_bytes == 0
    own, *periodic = step_4.snapshots
    assert (own.kind.value, own.sequence, Path(own.path).name) == (
        "trainer_checkpoint",
        None,
        "rollout_state",
    )
    assert periodic and all(s.kind.value == "rollout_snapshot" for s in periodic)
    assert [s.sequence for s in periodic] == sorted(int(Path(s.path).name[9:]) for s in periodic)
    assert all(s.age_s is not None and s.age_s >= 0 for s in step_4.snapshots)

    stalled = inspect_json(capsys, stalled_dir)
    (anchor,) = stalled.anchors
    assert anchor.kind.value == "bootstrap" and anchor.snapshots
    # Sibling 3 never finishes: every snapshot has work in flight and nothing canonical.
    for snapshot in anchor.snapshots:
        assert snapshot.contents is not None
        assert snapshot.contents.siblings.in_flight > 0
        assert snapshot.contents.canonical_groups == 0


def test_inspect_text_shows_a_row_per_snapshot(
    capsys: pytest.CaptureFixture[str], trained_dir: Path
) -> None:
    code, out, _ = run_cli(capsys, "inspect", trained_dir)
    assert code == 0
    stored = json.loads((trained_dir / "bootstrap" / "manifest.json").read_text())
    assert stored["fingerprint"] in out
    assert "of segments shared by its snapshots" in out
    lines = out.splitlines()
    for path in snapshot_dirs(trained_dir):
        expected = counts_from_files(path)
        (row,) = [line for line in lines if line.strip().startswith(path.name + " ")]
        cells = row.split()
        assert str(expected["mutation_version"]) in cells
        assert str(expected["train"]) in cells
        assert cells[-1] == "ok"


def test_inspect_shows_a_damaged_snapshot_and_leftovers_without_crashing(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    newest = newest_rollout_snapshot(trained_copy)
    flip_middle_byte(newest / "replay_buffer_metadata.json")
    leftover = newest.parent / "tmp_snapshot_000099"
    leftover.mkdir()
    (leftover / "manifest.json").write_text("not json")  # never read
    inventory = inspect_json(capsys, trained_copy)
    (entry,) = [s for a in inventory.anchors for s in a.snapshots if Path(s.path) == newest]
    assert entry.damage is not None
    assert entry.damage.path == str(newest / "replay_buffer_metadata.json")
    assert "SHA-256" in entry.damage.problem
    assert entry.manifest is not None and entry.contents is None
    assert str(leftover) in [p for a in inventory.anchors for p in a.leftovers]

    code, out, _ = run_cli(capsys, "inspect", trained_copy)
    assert code == 0
    assert "DAMAGED" in out
    assert "replay_buffer_metadata.json" in out
    assert "tmp_snapshot_000099" in out


def test_inspect_shows_a_snapshot_without_manifest_as_damaged(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    newest = newest_rollout_snapshot(trained_copy)
    (newest / "manifest.json").unlink()
    inventory = inspect_json(capsys, trained_copy)
    (entry,) = [s for a in inventory.anchors for s in a.snapshots if Path(s.path) == newest]
    assert entry.manifest is None and entry.age_s is None
    assert entry.damage == CheckpointProblem(str(newest / "manifest.json"), "missing")


@pytest.mark.slow
def test_inspect_into_a_closed_pipe_ends_with_sigpipe_status_not_a_traceback(
    trained_dir: Path,
) -> None:
    # `rollvault inspect --json DIR | head`: the reader is gone before the write.
    # Closing our read end first makes every write of the child fail, deterministically.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "rollvault.cli.main", "inspect", "--json", str(trained_dir)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert child.returncode == 128 + signal.SIGPIPE, child.stderr.decode()
    assert child.stderr == b""


# -- verify ----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["trained", "stalled"])
def test_verify_passes_a_clean_directory(
    capsys: pytest.CaptureFixture[str], which: str, trained_dir: Path, stalled_dir: Path
) -> None:
    checkpoint_dir = trained_dir if which == "trained" else stalled_dir
    code, out, _ = run_cli(capsys, "verify", checkpoint_dir)
    assert code == 0, out
    assert out.splitlines()[-1].endswith(
        f"checked {len(snapshot_dirs(checkpoint_dir))} snapshot(s): all good"
    )


@pytest.mark.parametrize("snapshot", ["newest", "trainer_checkpoint"])
@pytest.mark.parametrize("name", SNAPSHOT_FILES)
def test_verify_names_a_file_with_a_flipped_byte(
    capsys: pytest.CaptureFixture[str], trained_copy: Path, snapshot: str, name: str
) -> None:
    if snapshot == "newest":
        directory = newest_rollout_snapshot(trained_copy)
    else:
        directory = trained_copy / "step_4" / "rollout_state"
    damaged = snapshot_file(directory, name)
    flip_middle_byte(damaged)
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 1
    problems = [line for line in out.splitlines()[:-1] if not line.startswith("note:")]
    assert problems and all(line.startswith(f"{damaged}: ") for line in problems), out
    assert out.splitlines()[-1].endswith(f"{len(problems)} problem(s)")


@pytest.mark.parametrize("name", ["rollout_recovery.json", "segment:train"])
def test_verify_names_a_truncated_file(
    capsys: pytest.CaptureFixture[str], trained_copy: Path, name: str
) -> None:
    path = snapshot_file(newest_rollout_snapshot(trained_copy), name)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, out, _ = run_cli(capsys, "verify", trained_copy, "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert [p["path"] for p in report["problems"]] == [str(path)]


def test_verify_reports_every_damaged_file_not_only_the_first(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    newest = newest_rollout_snapshot(trained_copy)
    damaged = [newest / "controller_state.json", newest / "replacement_reserve.json"]
    damaged.append(snapshot_file(newest, "segment:train"))
    for path in damaged:
        flip_middle_byte(path)
    code, out, _ = run_cli(capsys, "verify", trained_copy, "--json")
    assert code == 1
    assert sorted(p["path"] for p in json.loads(out)["problems"]) == sorted(map(str, damaged))


def test_verify_checks_the_manifest_against_its_anchor(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    newest = newest_rollout_snapshot(trained_copy)
    manifest = read_snapshot_manifest(newest)
    moved = msgspec.structs.replace(manifest, base_train_step=8, trainer_version=8)
    (newest / "manifest.json").write_bytes(encode_snapshot_manifest(moved))
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 1
    assert f"{newest / 'manifest.json'}: base_train_step is 8; its anchor requires 4" in out
    assert f"{newest / 'manifest.json'}: trainer_version is 8; its anchor requires 4" in out


def test_verify_checks_the_bootstrap_anchor_and_the_trainer_state(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    anchor_manifest = trained_copy / "bootstrap" / "manifest.json"
    stored = json.loads(anchor_manifest.read_text())
    stored["config"]["seed"] += 1  # the identity no longer hashes to the stored fingerprint
    anchor_manifest.write_text(json.dumps(stored))
    shutil.rmtree(trained_copy / "step_4" / "trainer")
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 1
    assert f"{anchor_manifest}: corrupt: fingerprint" in out
    assert f"{trained_copy / 'step_4' / 'trainer'}: missing" in out


def test_a_lost_bootstrap_anchor_is_reported_not_fatal(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    shutil.rmtree(trained_copy / "bootstrap")
    anchor_manifest = trained_copy / "bootstrap" / "manifest.json"
    code, out, _ = run_cli(capsys, "inspect", trained_copy)
    assert code == 0
    assert f"bootstrap anchor DAMAGED: {Path('bootstrap') / 'manifest.json'}: missing" in out
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 1
    # Only the anchor: snapshots are still verified, each group against its own records.
    assert [line.split(": ")[0] for line in out.splitlines()[:-1]] == [str(anchor_manifest)]


def test_verify_notes_leftovers_but_never_reads_them(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    leftover = trained_copy / "step_4" / "rollout_snapshots" / "trash_snapshot_000000"
    leftover.mkdir()
    (leftover / "manifest.json").write_text("{broken")
    (trained_copy / "tmp_step_8").mkdir()
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 0, out
    assert f"note: {leftover} is a leftover" in out
    assert f"note: {trained_copy / 'tmp_step_8'} is a leftover" in out


# -- the cross-references read_snapshot does not check -----------------------------------


def load(snapshot: Path) -> LoadedSnapshot:
    manifest = read_snapshot_manifest(snapshot)
    return read_snapshot(snapshot, manifest, generations_per_group=GENERATIONS)


def with_rows(snapshot: LoadedSnapshot, partition: str, rows: dict[str, Any]) -> LoadedSnapshot:
    partitions = {name: dict(existing) for name, existing in snapshot.data_plane.partitions.items()}
    partitions.setdefault(partition, {}).update(rows)
    data_plane = LoadedCheckpoint(partitions, snapshot.data_plane.user_metadata)
    return dataclasses.replace(snapshot, data_plane=data_plane)


def without_rows(snapshot: LoadedSnapshot, partition: str, keys: set[str]) -> LoadedSnapshot:
    partitions = {name: dict(existing) for name, existing in snapshot.data_plane.partitions.items()}
    partitions[partition] = {k: v for k, v in partitions[partition].items() if k not in keys}
    data_plane = LoadedCheckpoint(partitions, snapshot.data_plane.user_metadata)
    return dataclasses.replace(snapshot, data_plane=data_plane)


def any_row(snapshot: LoadedSnapshot) -> Any:
    return next(r for rows in snapshot.data_plane.partitions.values() for r in rows.values())


def test_every_snapshot_of_real_runs_has_no_orphans(trained_dir: Path, stalled_dir: Path) -> None:
    for path in snapshot_dirs(trained_dir) | snapshot_dirs(stalled_dir):
        assert cross_reference_problems(load(path), generations_per_group=GENERATIONS) == []


def test_an_orphan_staged_row_is_reported_and_an_in_flight_one_is_not(
    stalled_dir: Path,
) -> None:
    snapshot = load(newest_rollout_snapshot(stalled_dir))
    ledger = ledger_of(snapshot.path, snapshot.recovery.ledger_state)
    record = ledger.groups()[0]
    stuck = record.siblings[3]
    assert stuck.current_attempt.status is RolloutAttemptStatus.DISPATCHED
    in_flight_key = staging_key(record.gate_rollout_id(3), 0)
    stale_key = staging_key(f"{record.group_id}_g3_a{'0' * 32}", 0)  # no such attempt
    row = any_row(snapshot)

    tolerated = with_rows(snapshot, STAGING_PARTITION, {in_flight_key: row})
    assert cross_reference_problems(tolerated, generations_per_group=GENERATIONS) == []

    orphaned = with_rows(tolerated, STAGING_PARTITION, {stale_key: row, "not-a-key": row})
    (problem,) = cross_reference_problems(orphaned, generations_per_group=GENERATIONS)
    assert problem.path == str(snapshot.path / "data_plane" / "metadata.json")  # the row index
    assert problem.problem.startswith("2 orphan rollout_staging rows")
    assert repr(stale_key) in problem.problem and "'not-a-key'" in problem.problem
    assert repr(in_flight_key) not in problem.problem


def test_a_staged_row_of_a_failed_attempt_is_an_orphan(stalled_dir: Path) -> None:
    snapshot = load(newest_rollout_snapshot(stalled_dir))
    state = json.loads(json.dumps(snapshot.recovery.ledger_state))
    attempt = state["groups"][0]["siblings"][3]["attempts"][-1]
    attempt.update(status="failed", failure_reason="infra: worker lost", failure_kind="infra")
    recovery = msgspec.structs.replace(
        snapshot.recovery, checked_ledger=msgspec.convert(state, LedgerState)
    )
    record = ledger_of(snapshot.path, state).groups()[0]
    key = staging_key(record.gate_rollout_id(3), 0)
    failed = dataclasses.replace(snapshot, recovery=recovery)
    failed = with_rows(failed, STAGING_PARTITION, {key: any_row(snapshot)})
    (problem,) = cross_reference_problems(failed, generations_per_group=GENERATIONS)
    assert repr(key) in problem.problem


def test_each_sealed_sibling_missing_a_staged_row_is_reported_naming_only_those_rows(
    stalled_dir: Path,
) -> None:
    snapshot = load(newest_rollout_snapshot(stalled_dir))
    sealed = [
        (group["group_id"], sibling["generation_index"], sibling["attempts"][-1]["staging_keys"])
        for group in snapshot.recovery.ledger_state["groups"]
        for sibling in group["siblings"]
        if sibling["attempts"][-1]["status"] == RolloutAttemptStatus.SEALED.value
        and sibling["attempts"][-1]["staging_keys"]
    ]
    assert len(sealed) >= 2
    (first_group, first_index, first_keys), (second_group, second_index, second_keys) = sealed[:2]
    gone = {first_keys[-1], *second_keys}
    missing = without_rows(snapshot, STAGING_PARTITION, gone)
    problems = [
        problem
        for problem in verify_loaded_snapshot(
            missing, generations_per_group=GENERATIONS, level=VerificationLevel.RESTORABLE
        )
        if problem.kind is ProblemKind.MISSING_ROWS
    ]
    assert [(problem.partition, problem.keys) for problem in problems] == [
        (STAGING_PARTITION, (first_keys[-1],)),
        (STAGING_PARTITION, tuple(sorted(second_keys))),
    ]
    assert f"group {first_group!r} sibling {first_index} names staged rows " in problems[0].problem
    assert f"group {second_group!r} sibling {second_index} " in problems[1].problem
    assert all(problem.path == snapshot.path / "rollout_recovery.json" for problem in problems)


def test_orphan_and_missing_train_rows_are_reported(trained_dir: Path) -> None:
    snapshot = load(newest_rollout_snapshot(trained_dir))
    entry = snapshot.replay.replay.entries[0]
    ghost = with_rows(snapshot, TRAIN_PARTITION, {"ghost_g0": any_row(snapshot)})
    (problem,) = cross_reference_problems(ghost, generations_per_group=GENERATIONS)
    # A segmented snapshot's rows are listed in its data-plane index.
    assert snapshot.segments is not None
    assert problem.path == str(snapshot.path / "data_plane" / "metadata.json")
    assert "1 orphan train rows" in problem.problem and "'ghost_g0'" in problem.problem

    gone = without_rows(snapshot, TRAIN_PARTITION, {f"{entry.group_id}_g2"})
    (problem,) = cross_reference_problems(gone, generations_per_group=None)
    assert problem.path == str(snapshot.path / "replay_buffer_metadata.json")
    assert f"'{entry.group_id}_g2'" in problem.problem


def test_group_sizes_other_than_the_runs_are_reported(trained_dir: Path, stalled_dir: Path) -> None:
    for checkpoint_dir in (trained_dir, stalled_dir):
        snapshot = load(newest_rollout_snapshot(checkpoint_dir))
        assert cross_reference_problems(snapshot, generations_per_group=GENERATIONS) == []
        problems = cross_reference_problems(snapshot, generations_per_group=GENERATIONS + 1)
        by_file = Counter(Path(p.path).name for p in problems)
        # The canonical groups' attempt ids are in the group facts (before them: the replay
        # metadata), so that is the file named.
        attempts = (
            "group_facts.json" if snapshot.facts is not None else "replay_buffer_metadata.json"
        )
        expected = {
            "rollout_recovery.json": len(snapshot.recovery.ledger_state["groups"]),
            attempts: len(snapshot.replay.replay.entries),
        }
        assert by_file == +Counter(expected)
        assert sum(expected.values()) > 0
        assert all(f"the run makes {GENERATIONS + 1} per prompt" in p.problem for p in problems)


# -- no run ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_missing_directory_or_one_without_a_run_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    code, out, err = run_cli(capsys, command, tmp_path / "absent")
    assert (code, out) == (2, "")
    assert f"{tmp_path / 'absent'} does not exist" in err

    code, out, err = run_cli(capsys, command, tmp_path)
    assert (code, out) == (2, "")
    assert "holds no run" in err


def test_a_run_root_gets_a_hint(
    capsys: pytest.CaptureFixture[str], trained_dir: Path, tmp_path: Path
) -> None:
    # `rollvault run` writes runs/<name>/checkpoints beside runs/<name>/logs.
    shutil.copytree(trained_dir, tmp_path / "checkpoints")
    code, _, err = run_cli(capsys, "verify", tmp_path)
    assert code == 2
    assert f"did you mean {tmp_path / 'checkpoints'}?" in err


def test_verify_checks_the_version_zero_policy_against_its_digests(
    capsys: pytest.CaptureFixture[str], trained_copy: Path
) -> None:
    def write(directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(bytes(range(256)) * 16)
        (directory / "config.json").write_text("{}")

    policy = publish_directory(
        trained_copy / BOOTSTRAP_DIRNAME / BOOTSTRAP_POLICY_DIRNAME, write, with_digests=True
    )
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 0, out
    flip_middle_byte(policy / "model.safetensors")
    code, out, _ = run_cli(capsys, "verify", trained_copy)
    assert code == 1
    assert f"{policy / 'model.safetensors'}: version-0 policy file: content changed" in out
