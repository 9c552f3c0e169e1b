"""Restore checks exactly as the spec says, on real snapshots of in-process runs.

``tests/fixtures/rollout_snapshots`` holds one snapshot per supported sidecar
version, made by its ``make_fixtures.py``; they must keep restoring whatever
version the code writes next.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest
from pipeline_helpers import (
    dataset_of,
    expected_prompts,
    run_simulated,
    run_until_crash,
    small_config,
)
from snapshot_versions import (
    advertise_sidecar,
    downgrade_snapshot_to_v3,
    read_sidecar,
    rewrite_sidecar,
)

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    effective_drops,
    read_run_history,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots import restorer, snapshot_files
from rollvault.controller.snapshots.restorer import read_recovery_sidecar
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import (
    LoadedSnapshot,
    SnapshotCorruptError,
    segments_dir_for,
)
from rollvault.controller.snapshots.verification import read_snapshot
from rollvault.dataplane.segmented_index import checkpoint_summary
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME, ParsedRolloutRecoveryState
from rollvault.ledger.state_schema import SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS
from rollvault.ledger.statuses import AttemptFailureKind, RolloutAttemptStatus
from rollvault.training.recording import RecordingTrainer

FIXTURES: Final = Path(__file__).resolve().parent.parent / "fixtures" / "rollout_snapshots"
# The settings make_fixtures.py ran with (FIXTURE_OVERRIDES there).
FIXTURE_OVERRIDES: Final = (
    "gate.simulated.latency_per_token_s=0.002",
    "gate.simulated.transient_failure_rate=0.3",
    "rollout_checkpointing.interval_s=0.05",
    "checkpointing.save_period=1000",
)


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, *FIXTURE_OVERRIDES, *overrides)


def _fixture(version: int, tmp_path: Path) -> Path:
    """A copy of the fixture snapshot of ``version`` (tests may damage it)."""
    copy = tmp_path / f"v{version}"
    shutil.copytree(FIXTURES / f"v{version}", copy)
    return copy


def _read(snapshot: Path) -> LoadedSnapshot:
    manifest = read_snapshot_manifest(snapshot)
    return read_snapshot(snapshot, manifest, generations_per_group=4)


def _newest_bootstrap_snapshot(config: RunConfig) -> Path:
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    return committed_snapshot_paths(root)[-1]


def test_every_supported_sidecar_version_has_a_fixture() -> None:
    # A new version adds its fixture; an old one's is kept while it is supported.
    versions = {int(path.name[1:]) for path in FIXTURES.glob("v*") if path.is_dir()}
    assert versions == set(SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS)


@pytest.mark.parametrize("version", sorted(SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS))
def test_a_fixture_snapshot_of_each_supported_version_reads_as_today_s_state(
    tmp_path: Path, version: int
) -> None:
    snapshot = _fixture(version, tmp_path)
    assert read_sidecar(snapshot)["schema_version"] == version
    loaded = _read(snapshot)
    # Version 3 is upgraded: the same state as the version 4 fixture, failure kinds
    # inferred from the reasons the controller prefixed with them.
    assert loaded.recovery == _read(FIXTURES / "v4").recovery
    metadata = checkpoint_summary(snapshot / "data_plane", segments_dir_for(snapshot)).user_metadata
    config = _config(tmp_path)
    sidecar = snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    parsed = asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config))
    assert parsed == loaded.recovery
    ledger = RolloutRecoveryLedger.from_state_dict(parsed.ledger_state)
    failed = [
        attempt
        for record in ledger.groups()
        for sibling in record.siblings
        for attempt in sibling.attempts
        if attempt.status is RolloutAttemptStatus.FAILED
    ]
    assert failed and {a.failure_kind for a in failed} == {AttemptFailureKind.INFRA}


@pytest.mark.parametrize(("written", "advertised"), [(3, 4), (4, 3)])
def test_a_sidecar_whose_version_is_not_the_advertised_one_is_refused(
    tmp_path: Path, written: int, advertised: int
) -> None:
    snapshot = _fixture(written, tmp_path)
    advertise_sidecar(snapshot, schema_version=advertised)  # its checksum still matches
    with pytest.raises(
        SnapshotCorruptError,
        match=f"rollout_recovery.json: schema_version {written} differs from the ledger "
        f"schema {advertised}",
    ):
        _read(snapshot)


def test_a_real_run_s_snapshot_in_version_3_resumes_and_trains_every_prompt_once(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    newest = _newest_bootstrap_snapshot(config)
    downgrade_snapshot_to_v3(newest)
    assert read_sidecar(newest)["schema_version"] == 3
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    (restore,) = history.restores
    assert restore.snapshot == str(newest), "the version 3 snapshot was not the one restored"
    assert restore.siblings_reused > 0
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_the_committed_version_3_fixture_restores_into_a_run(tmp_path: Path) -> None:
    # A run of the fixture's settings, its snapshots replaced by the fixture's:
    # only the manifest's anchor fingerprint is today's (it covers every config
    # field, so it changes whenever one is added).
    config = _config(tmp_path)
    run_until_crash(config, 1)
    newest = _newest_bootstrap_snapshot(config)
    fingerprint = read_snapshot_manifest(newest)
    target = newest.parent / "snapshot_999999"
    shutil.copytree(FIXTURES / "v3", target)
    manifest_path = target / ROLLOUT_SNAPSHOT_MANIFEST_FILENAME
    manifest = msgspec.json.decode(manifest_path.read_bytes())
    manifest["bootstrap_fingerprint"] = fingerprint.bootstrap_fingerprint
    manifest_path.write_bytes(msgspec.json.encode(manifest))
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path == target
    fixture = _read(FIXTURES / "v4")
    log_dir = Path(config.logging.log_dir)
    shutil.rmtree(log_dir)  # the fixture's run, not this one, trained before it
    run_simulated(config)
    history = read_run_history(log_dir)
    (restore,) = history.restores
    assert restore.snapshot == str(target)
    assert sorted(restore.canonical_group_ids) == sorted(
        entry.group_id for entry in fixture.replay.replay.entries
    )
    done = [(record.epoch, record.sample_id) for record in history.train]
    done += [(drop.epoch, drop.sample_id) for drop in effective_drops(history)]
    assert len(done) == len(set(done)), "a prompt was trained or dropped twice"
    in_snapshot = {
        (origin.epoch, str(origin.dataset_idx)) for origin in fixture.controller.origins.values()
    }
    assert in_snapshot <= set(done), "a group the snapshot held was neither trained nor dropped"


def test_a_sidecar_without_reward_settings_is_refused_naming_it(tmp_path: Path) -> None:
    snapshot = _fixture(4, tmp_path)
    state = read_sidecar(snapshot)
    state["reward_settings"] = None
    rewrite_sidecar(snapshot, state)
    sidecar = snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    refusal = f"{sidecar}: reward_settings is null"
    with pytest.raises(SnapshotCorruptError, match=re.escape(refusal)):
        _read(snapshot)
    metadata = checkpoint_summary(snapshot / "data_plane", segments_dir_for(snapshot)).user_metadata
    with pytest.raises(SnapshotCorruptError, match=re.escape(refusal)):
        asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=_config(tmp_path)))


def test_a_real_snapshot_without_reward_settings_is_passed_over_for_an_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, "rollout_checkpointing.keep_latest_k=3")
    run_until_crash(config, 3)
    newest = _newest_bootstrap_snapshot(config)
    state = read_sidecar(newest)
    assert state["reward_settings"] is not None  # the checkpointer always records them
    state["reward_settings"] = None
    rewrite_sidecar(newest, state)
    with caplog.at_level(logging.WARNING, logger="rollvault.durable"):
        source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path != newest
    assert "reward_settings is null" in caplog.text and str(newest) in caplog.text
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_every_real_restore_reads_the_sidecar_through_read_recovery_sidecar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    calls: list[Path] = []
    spec_function = restorer.read_recovery_sidecar

    async def spy(
        recovery_path: Path, metadata: Mapping[str, Any], *, master_config: RunConfig
    ) -> ParsedRolloutRecoveryState:
        calls.append(recovery_path)
        return await spec_function(recovery_path, metadata, master_config=master_config)

    monkeypatch.setattr(restorer, "read_recovery_sidecar", spy)
    run_simulated(config)
    (restore,) = read_run_history(Path(config.logging.log_dir)).restores
    assert restore.snapshot is not None
    assert calls == [Path(restore.snapshot) / ROLLOUT_RECOVERY_STATE_FILENAME]


def test_a_sidecar_changed_after_the_snapshot_was_chosen_is_refused_by_the_restore(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    run_until_crash(config, 3)
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    sidecar = source.snapshot.path / ROLLOUT_RECOVERY_STATE_FILENAME
    # Version 6 sidecars hold an index, not the records: any changed byte will do.
    sidecar.write_bytes(sidecar.read_bytes() + b" ")

    async def restore() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        try:
            await restorer.RolloutRestorer(
                parts,
                trainer=RecordingTrainer(),
                buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
                resume=source,
            ).restore()
        finally:
            parts.logs.close()
            if parts.seal_journal is not None:
                parts.seal_journal.close()

    with pytest.raises(SnapshotCorruptError, match=re.escape(f"{sidecar}: SHA-256")):
        asyncio.run(restore())


def _sidecar_reader(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], Any], list[object]]:
    """The restore's read of ``snapshot``'s sidecar, and the functions it hands to a thread."""
    metadata = checkpoint_summary(snapshot / "data_plane", segments_dir_for(snapshot)).user_metadata
    sidecar = snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    config = _config(tmp_path)
    handed: list[object] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(function: Any, /, *args: Any, **kwargs: Any) -> Any:
        handed.append(function)
        return await real_to_thread(function, *args, **kwargs)

    monkeypatch.setattr(restorer.asyncio, "to_thread", to_thread)
    return (
        lambda: asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config)),
        handed,
    )


def test_the_restore_rereads_verified_bytes_on_the_loop_and_decodes_others_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_files._LAST_DECODED.clear()  # another test may have left its last parse
    snapshot = _fixture(5, tmp_path)
    loaded = _read(snapshot)
    read, handed = _sidecar_reader(snapshot, tmp_path, monkeypatch)
    again = read()
    assert again is loaded.recovery and handed == []  # hashed again, not decoded, no thread
    third = read()
    assert third == loaded.recovery and handed == [snapshot_files.read_recovery_sidecar_file]


def test_a_snapshot_verified_twice_is_still_not_decoded_again_by_the_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_files._LAST_DECODED.clear()  # another test may have left its last parse
    snapshot = _fixture(5, tmp_path)
    first = _read(snapshot)
    # The same bytes again: verification decodes them again (it checks what is on disk)
    # and its parse replaces the first one for the restore.
    second = _read(snapshot)
    assert second.recovery == first.recovery and second.recovery is not first.recovery
    read, handed = _sidecar_reader(snapshot, tmp_path, monkeypatch)
    again = read()
    assert again is second.recovery and handed == []
    # The restore's own decode (nothing verified left) is not kept for the rest of the run.
    third = read()
    assert third == second.recovery and handed == [snapshot_files.read_recovery_sidecar_file]
    assert snapshot_files._LAST_DECODED == {}


def test_the_restore_reuses_the_parse_of_the_bytes_verification_just_read(tmp_path: Path) -> None:
    snapshot_files._LAST_DECODED.clear()  # another test may have left its last parse
    snapshot = _fixture(5, tmp_path)
    loaded = _read(snapshot)
    metadata = checkpoint_summary(snapshot / "data_plane", segments_dir_for(snapshot)).user_metadata
    sidecar = snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    config = _config(tmp_path)
    again = asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config))
    assert again is loaded.recovery  # the same bytes (hashed again): not decoded again
    third = asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config))
    assert third == loaded.recovery and third is not loaded.recovery  # used once, then dropped
    _read(snapshot)
    sidecar.write_bytes(sidecar.read_bytes().replace(b'"sealed"', b'"failed"', 1))
    with pytest.raises(SnapshotCorruptError, match="SHA-256"):
        asyncio.run(read_recovery_sidecar(sidecar, metadata, master_config=config))
