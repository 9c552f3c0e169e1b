"""Incremental rollout snapshots through the real checkpointer: each writes only the rows
new since the one before, shares the rest, and the segments no kept snapshot references
are deleted; a missing segment makes restore fall back, and a restart's first snapshot
writes only new rows."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import dataset_of, small_config
from snapshot_versions import (
    data_plane_index_to_version_2,
    data_plane_index_to_version_3,
    data_plane_index_to_version_4,
)
from test_group_entries import _reserve

from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots import checkpointer as checkpointer_module
from rollvault.controller.snapshots.checkpointer import Checkpointer
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import (
    ResumeSource,
    prepare_checkpoint_dir,
    run_fingerprint,
)
from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import DATA_PLANE_DIRNAME, segments_dir_for
from rollvault.controller.snapshots.verification import (
    ProblemKind,
    VerificationLevel,
    verify_snapshot,
)
from rollvault.dataplane.checkpoint_format import decode_envelope
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION
from rollvault.dataplane.segmented_index import read_segmented_content
from rollvault.dataplane.segments import read_segment, segment_files
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer

SIBLINGS = 4  # small_config's grpo.num_generations_per_prompt


def _config(tmp_path: Path) -> RunConfig:
    return small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")


def verified_resume(config: RunConfig, newest: Path) -> ResumeSource:
    """What a restart resumes from, once ``newest`` verifies in full: ``newest`` itself."""
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
    )
    assert verification.ok, verification.problems
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path == newest
    return source


def _segments_of(snapshot: Path) -> dict[str, str]:
    """The segments a snapshot references: file name to partition."""
    content = read_segmented_content(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))
    return {reference.file: reference.partition for reference in content.segments}


def _keys_in(snapshot: Path, file: str) -> set[str]:
    content = read_segmented_content(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))
    (reference,) = [r for r in content.segments if r.file == file]
    segment = read_segment(
        segments_dir_for(snapshot) / file,
        partition=reference.partition,
        sha256=reference.sha256,
        byte_size=reference.byte_size,
        row_count=reference.row_count,
    )
    return set(segment.keys)


class Run:
    """Parts, a simulated gate and a checkpointer, filled as the rollout pump would."""

    def __init__(self, parts: RolloutParts, fingerprint: str) -> None:
        self.parts = parts
        self.gate = SimulatedGate(
            parts.config.gate.simulated, parts.data_plane, ParityEnvironment(), seed=0
        )
        self.checkpointer = Checkpointer(parts, RecordingTrainer(), fingerprint=fingerprint)

    @classmethod
    def fresh(cls, config: RunConfig) -> Run:
        """A first start of ``config``'s run: its checkpoint directory holds nothing yet."""
        assert prepare_checkpoint_dir(config, dataset=dataset_of(config)) is None
        return cls(build_parts(config, dataset=dataset_of(config)), run_fingerprint(config))

    @classmethod
    async def restored(cls, config: RunConfig, source: ResumeSource) -> Run:
        """A restart from ``source``, as the pipeline makes it: the parts restored, and the
        checkpointer seeded with the rows, ledger records and group facts the restore loaded."""
        parts = build_parts(config, dataset=dataset_of(config))
        restorer = RolloutRestorer(
            parts,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=source,
        )
        await restorer.restore()
        assert restorer.segment_seed is not None and restorer.ledger_seed is not None
        assert restorer.fact_seed is not None
        run = cls(parts, run_fingerprint(config))
        run.checkpointer.seed_segments(
            restorer.segment_seed, ledger=restorer.ledger_seed, facts=restorer.fact_seed
        )
        return run

    async def snapshot(self) -> Path:
        path = await self.checkpointer.snapshot_if_changed()
        assert path is not None
        return path

    def staged(self) -> set[str]:
        return set(self.parts.data_plane.keys(STAGING_PARTITION))


def test_each_snapshot_writes_only_new_rows_and_old_segments_are_collected(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def main() -> list[Path]:
        run = Run.fresh(config)
        finalizer = Finalizer(run.parts, end_weight_version={})
        full = [await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate) for _ in range(2)]
        first = await run.snapshot()
        (shared,) = set(_segments_of(first))
        before = run.staged()
        await _reserve(run.parts, sealed=1, gate=run.gate)
        second = await run.snapshot()
        (new_file,) = set(_segments_of(second)) - {shared}
        assert _keys_in(second, new_file) == run.staged() - before
        assert shared in _segments_of(second)
        for group_id in full:
            await finalizer.finalize(group_id)
        third = await run.snapshot()
        partitions = set(_segments_of(third).values())
        assert partitions == {STAGING_PARTITION, TRAIN_PARTITION}
        assert shared not in _segments_of(third)  # its rows were all finalized
        assert shared in segment_files(segments_dir_for(third))  # the second still holds them
        await _reserve(run.parts, sealed=1, gate=run.gate)
        fourth = await run.snapshot()
        on_disk = set(segment_files(segments_dir_for(fourth)))
        assert on_disk == set(_segments_of(third)) | set(_segments_of(fourth))
        assert shared not in on_disk
        run.parts.logs.close()
        return [third, fourth]

    kept = asyncio.run(main())
    for snapshot in kept:
        verification = verify_snapshot(
            snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
        )
        assert verification.ok, verification.problems


async def _two_snapshots(config: RunConfig) -> tuple[Path, Path]:
    """A fresh run's older and newest snapshots, rows sealed before each."""
    run = Run.fresh(config)
    await _reserve(run.parts, sealed=2, gate=run.gate)
    older = await run.snapshot()
    await _reserve(run.parts, sealed=3, gate=run.gate)
    newest = await run.snapshot()
    run.parts.logs.close()
    return older, newest


def test_a_missing_segment_rejects_its_snapshots_and_restore_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path)

    older, newest = asyncio.run(_two_snapshots(config))
    (only_newest,) = set(_segments_of(newest)) - set(_segments_of(older))
    missing = segments_dir_for(newest) / only_newest
    missing.unlink()
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.kind is ProblemKind.DAMAGED and problem.path == missing
    assert "missing segment" in problem.problem
    with caplog.at_level(logging.WARNING):
        source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path == older
    assert str(missing) in caplog.text
    restored_segments = set(_segments_of(older))

    async def restart() -> tuple[set[str], set[str]]:
        run = await Run.restored(config, source)
        parts = run.parts
        before = run.staged()
        await _reserve(parts, sealed=2, gate=run.gate)
        after = await run.snapshot()
        parts.logs.close()
        new = set(_segments_of(after)) - restored_segments
        return {key for file in new for key in _keys_in(after, file)}, run.staged() - before

    written, put = asyncio.run(restart())
    assert written == put and put  # the restored rows were referenced, not rewritten


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_catalog_rejects_the_snapshot_listing_it_and_restore_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """The row segments' catalog is checked like a segment (invariant 6): a flipped byte or a
    missing file names it, and restore takes the older snapshot, which does not list it."""
    config = _config(tmp_path)

    older, newest = asyncio.run(_two_snapshots(config))

    def catalogs(snapshot: Path) -> set[str]:
        index = read_segmented_content(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))
        return {catalog.file for catalog in index.catalogs}

    (only_newest,) = catalogs(newest) - catalogs(older)
    catalog = segments_dir_for(newest) / only_newest
    if damage == "flip":
        data = bytearray(catalog.read_bytes())
        data[len(data) // 2] ^= 0x01
        catalog.write_bytes(bytes(data))
    else:
        catalog.unlink()
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.kind is ProblemKind.DAMAGED and problem.path == catalog
    assert ("checksum mismatch" if damage == "flip" else "missing catalog") in problem.problem
    assert verify_snapshot(
        older, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    ).ok
    with caplog.at_level(logging.WARNING):
        source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path == older
    assert str(catalog) in caplog.text


def test_segments_are_kept_while_a_committed_snapshot_s_index_is_unreadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "rollout_snapshots"
    (root / "snapshot_000001" / DATA_PLANE_DIRNAME).mkdir(parents=True)
    (root / "snapshot_000001" / DATA_PLANE_DIRNAME / "metadata.json").write_text("{damaged")
    (root / "segments").mkdir()
    orphan = root / "segments" / "000001-train.segment.safetensors"
    orphan.write_bytes(b"rows")
    with caplog.at_level(logging.WARNING, logger="rollvault.checkpointer"):
        assert collect_segments(root) is None
    assert orphan.exists()  # what the damaged snapshot references is unknown
    assert "kept every segment" in caplog.text
    (root / "snapshot_000001").rename(root / "trash_snapshot_000001")
    assert collect_segments(root) == [orphan.name]
    assert not orphan.exists()


def test_a_snapshot_that_failed_after_its_segment_was_written_is_retried_under_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed snapshot's directory is removed, so its sequence number comes again: the
    orphan segment of the failed try is replaced, and nothing references it meanwhile."""
    config = _config(tmp_path)
    real = checkpointer_module.write_snapshot_payload
    failures = [True]

    def fails_once(capture: Any, directory: Path, *, segments: Any, ledger: Any, facts: Any) -> int:
        written = real(capture, directory, segments=segments, ledger=ledger, facts=facts)
        if failures and failures.pop():
            raise OSError(errno.ENOSPC, "No space left on device")
        return written

    monkeypatch.setattr(checkpointer_module, "write_snapshot_payload", fails_once)

    async def main() -> tuple[Path | None, Path]:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=2, gate=run.gate)
        failed = await run.checkpointer.snapshot_if_changed()
        await _reserve(run.parts, sealed=1, gate=run.gate)
        retried = await run.snapshot()
        run.parts.logs.close()
        return failed, retried

    failed, retried = asyncio.run(main())
    assert failed is None and retried.name == "snapshot_000001"
    assert set(segment_files(segments_dir_for(retried))) == set(_segments_of(retried))
    verification = verify_snapshot(
        retried, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
    )
    assert verification.ok, verification.problems


def _index_version(snapshot: Path) -> int:
    path = snapshot / DATA_PLANE_DIRNAME / "metadata.json"
    version, _content = decode_envelope(path.read_bytes(), path)
    return version


@pytest.mark.parametrize(
    ("version", "convert"),
    [
        (2, data_plane_index_to_version_2),
        (3, data_plane_index_to_version_3),
        (4, data_plane_index_to_version_4),
    ],
)
def test_a_snapshot_whose_row_index_is_an_older_version_restores_and_the_next_writes_version_5(
    tmp_path: Path, version: int, convert: Any
) -> None:
    config = _config(tmp_path)

    async def write() -> tuple[Path, set[str], set[str]]:
        run = Run.fresh(config)
        finalizer = Finalizer(run.parts, end_weight_version={})
        full = [await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate) for _ in range(2)]
        await _reserve(run.parts, sealed=2, gate=run.gate)
        await run.snapshot()
        await finalizer.finalize(full[0])  # rows in both partitions, holes in staging
        newest = await run.snapshot()
        staged, train = run.staged(), set(run.parts.data_plane.keys(TRAIN_PARTITION))
        run.parts.logs.close()
        return newest, staged, train

    newest, staged, train = asyncio.run(write())
    assert _index_version(newest) == 5
    segments = _segments_of(newest)
    convert(newest)  # as an older writer left it (3: before catalogs, 4: before runs)
    assert _index_version(newest) == version
    assert _segments_of(newest) == segments
    source = verified_resume(config, newest)

    async def restart() -> tuple[Path, set[str]]:
        run = await Run.restored(config, source)
        assert run.staged() == staged
        assert set(run.parts.data_plane.keys(TRAIN_PARTITION)) == train
        before = run.staged()
        await _reserve(run.parts, sealed=1, gate=run.gate)
        after = await run.snapshot()
        new = run.staged() - before
        run.parts.logs.close()
        return after, new

    after, new = asyncio.run(restart())
    assert _index_version(after) == 5
    # The rows the older index held are referenced, not written again; before version 4
    # one new catalog describes every held segment (the older index had none), version 4's
    # catalogs go on describing theirs and only the new segment gets a new one.
    index = read_segmented_content(after / DATA_PLANE_DIRNAME, segments_dir_for(after))
    described = [file for catalog in index.catalogs for file in catalog.segments]
    assert sorted(described) == sorted(_segments_of(after))
    newest_catalog = index.catalogs[-1]
    if version < 4:
        assert index.catalogs == (newest_catalog,)
    else:
        assert set(newest_catalog.segments) == set(_segments_of(after)) - set(segments)
    fresh = set(_segments_of(after)) - set(segments)
    assert {key for file in fresh for key in _keys_in(after, file)} == new
    assert verify_snapshot(after, generations_per_group=SIBLINGS, level=VerificationLevel.FULL).ok


def test_a_damaged_row_segment_is_named_before_a_damaged_sidecar(tmp_path: Path) -> None:
    """The rows' segments are hashed in a worker thread while the sidecars are read: a
    snapshot damaged in both still names its row segment, the problem the read met first
    when it read the data plane whole before the sidecars."""
    config = _config(tmp_path)

    async def write() -> Path:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=2, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return newest

    newest = asyncio.run(write())
    (staging,) = [f for f, p in _segments_of(newest).items() if p == STAGING_PARTITION]
    segment = segments_dir_for(newest) / staging
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0x01  # in the last tensor's bytes: only the SHA-256 tells
    segment.write_bytes(bytes(data))
    sidecar = newest / ROLLOUT_RECOVERY_STATE_FILENAME
    sidecar.write_bytes(sidecar.read_bytes() + b" ")
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.kind is ProblemKind.DAMAGED and problem.path == segment
    assert "segment checksum mismatch" in problem.problem
    segment.unlink()  # the row segment missing: still named before the sidecar
    (problem,) = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    ).problems
    assert problem.path == segment and "missing segment" in problem.problem
