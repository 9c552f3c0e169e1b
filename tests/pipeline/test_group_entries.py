"""The per-group entries of RolloutParts: their transitions, and the snapshot round trip."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from pipeline_helpers import dataset_of, small_config
from snapshot_versions import read_sidecar, rewrite_sidecar

from rollvault.config.schema import RestoreMode
from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.gate import AttemptRequest
from rollvault.controller.loop.parts import (
    FinalizedGroup,
    GroupOrigin,
    GroupStage,
    GroupStateError,
    RolloutParts,
)
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots.checkpointer import build_snapshot, take_cut_capture
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import ResumeSource
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    LoadedSnapshot,
    RolloutStateCapture,
    write_snapshot_payload,
)
from rollvault.controller.snapshots.verification import read_snapshot
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, train_key
from rollvault.durable.manifest_schema import write_snapshot_manifest
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.reward_penalties import FinalizedReward
from rollvault.ledger.statuses import PromptGroupStatus
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer

ORIGIN = GroupOrigin(epoch=1, dataset_idx=7)
FINALIZED = FinalizedGroup.of(
    rewards=[FinalizedReward(raw_reward=1.0, reward=0.5, masked=False)],
    metrics={"reward_mean": 0.5},
    gate_rollout_ids=["g_g0_a1"],
)


def _parts(tmp_path: Path) -> RolloutParts:
    async def make() -> RolloutParts:
        config = small_config(tmp_path)
        return build_parts(config, dataset=dataset_of(config))

    return asyncio.run(make())


def test_a_group_is_reserved_pending_then_finalized_keeping_its_origin(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    parts.add_reserved_group("g", ORIGIN)
    assert parts.group("g").stage is GroupStage.PENDING
    parts.record_finalization("g", FINALIZED)
    entry = parts.group("g")
    assert entry.stage is GroupStage.FINALIZED
    assert entry.origin == ORIGIN
    assert entry.finalization() is FINALIZED
    assert parts.forget_group("g") == entry
    assert "g" not in parts.groups


@pytest.mark.parametrize(
    ("prepare", "act", "message"),
    [
        ([], lambda p: p.record_finalization("g", FINALIZED), "'g' cannot be finalized: it is un"),
        (["reserve", "finalize"], lambda p: p.record_finalization("g", FINALIZED), "already fin"),
        (["reserve"], lambda p: p.add_reserved_group("g", ORIGIN), "already pending"),
        (["reserve", "finalize"], lambda p: p.add_reserved_group("g", ORIGIN), "already finalized"),
        (["reserve"], lambda p: p.group("g").finalization(), "'g' is pending: it has no final"),
        ([], lambda p: p.forget_group("g"), "'g' cannot be forgotten: it is unknown"),
        ([], lambda p: p.group("g"), "'g' is unknown"),
    ],
)
def test_a_transition_the_stage_forbids_names_the_group_and_its_stage(
    tmp_path: Path, prepare: list[str], act: object, message: str
) -> None:
    parts = _parts(tmp_path)
    if "reserve" in prepare:
        parts.add_reserved_group("g", ORIGIN)
    if "finalize" in prepare:
        parts.record_finalization("g", FINALIZED)
    before = dict(parts.groups)
    with pytest.raises(GroupStateError, match=message):
        act(parts)  # type: ignore[operator]
    assert parts.groups == before


def test_load_groups_enters_canonical_groups_finalized_and_the_rest_pending(
    tmp_path: Path,
) -> None:
    parts = _parts(tmp_path)
    other = GroupOrigin(epoch=0, dataset_idx=3)
    parts.load_groups(
        {"done": ORIGIN, "open": other},
        rewards={"done": FINALIZED.rewards},
        metrics={"done": FINALIZED.metrics_dict()},
        gate_rollout_ids={"done": FINALIZED.gate_rollout_ids},
    )
    assert parts.group("done").finalization() == FINALIZED
    assert parts.group("done").origin == ORIGIN
    assert parts.group("open").stage is GroupStage.PENDING
    assert parts.group("open").origin == other


@pytest.mark.parametrize(
    ("origins", "rewards", "attempts", "message"),
    [
        ({}, {"g": []}, {"g": []}, "canonical group 'g' has no origin"),
        ({"g": ORIGIN}, {}, {"g": []}, "canonical group 'g' lacks its finalizer rewards"),
        ({"g": ORIGIN}, {"g": []}, {}, "group 'g' has finalizer rewards or metrics but no"),
    ],
)
def test_load_groups_refuses_maps_that_disagree_and_enters_nothing(
    tmp_path: Path,
    origins: dict[str, GroupOrigin],
    rewards: dict[str, list[FinalizedReward]],
    attempts: dict[str, list[str]],
    message: str,
) -> None:
    parts = _parts(tmp_path)
    with pytest.raises(GroupStateError, match=message):
        parts.load_groups(
            origins,
            rewards=rewards,
            metrics={g: {} for g in rewards},
            gate_rollout_ids=attempts,
        )
    assert parts.groups == {}


def test_load_groups_refuses_a_group_already_entered(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    parts.add_reserved_group("g", ORIGIN)
    with pytest.raises(GroupStateError, match="'g' cannot be restored: it is already pending"):
        parts.load_groups({"g": ORIGIN}, rewards={}, metrics={}, gate_rollout_ids={})


async def _reserve(parts: RolloutParts, *, sealed: int, gate: SimulatedGate) -> str:
    """Reserve the dataloader's next prompt as the rollout pump does; seal ``sealed`` siblings."""
    async with parts.cut.mutation():
        epoch, idx = parts.dataloader.next_index()
        record = parts.ledger.reserve_group(
            parts.cut,
            prompt_id=str(idx),
            prompt_payload=parts.dataset[idx],
            expected_generations=parts.config.grpo.num_generations_per_prompt,
            target_step=parts.sampler.admit(epoch=epoch, trainer_version=0),
            start_weight_version=0,
        )
        parts.add_reserved_group(record.group_id, GroupOrigin(epoch=epoch, dataset_idx=idx))
        parts.ledger.mark_group_dispatched(parts.cut, record.group_id)
    for index in range(sealed):
        request = AttemptRequest(
            group_id=record.group_id,
            generation_index=index,
            gate_rollout_id=record.gate_rollout_id(index),
            prompt=dict(record.prompt_payload),
            weight_version=0,
        )
        outcome = await gate.run_attempt(request)
        async with parts.cut.mutation():
            parts.ledger.mark_sibling_sealed(
                parts.cut,
                record.group_id,
                generation_index=index,
                gate_rollout_id=request.gate_rollout_id,
                receipt=outcome.receipt,
                reward=outcome.reward,
                mask_sample=False,
                reward_checks=outcome.reward_checks,
                reward_log_context=outcome.reward_log_context,
            )
    return record.group_id


async def _fill(parts: RolloutParts) -> None:
    """Two canonical groups (one trained since the checkpoint) and two pending ones."""
    gate = SimulatedGate(parts.config.gate.simulated, parts.data_plane, ParityEnvironment(), seed=0)
    finalizer = Finalizer(parts, end_weight_version={})
    siblings = parts.config.grpo.num_generations_per_prompt
    trained = await finalizer.finalize(await _reserve(parts, sealed=siblings, gate=gate))
    await finalizer.finalize(await _reserve(parts, sealed=siblings, gate=gate))
    async with parts.cut.mutation():
        parts.replay.remove(trained.group_id)
        parts.trained_since_checkpoint.append(trained)
    await _reserve(parts, sealed=2, gate=gate)
    await _reserve(parts, sealed=0, gate=gate)


async def _write(parts: RolloutParts, directory: Path) -> RolloutStateCapture:
    async with parts.cut.checkpoint():
        cut = take_cut_capture(parts)
    capture = build_snapshot(cut, parts, fingerprint=None)
    directory.mkdir()
    write_snapshot_payload(capture, directory)
    write_snapshot_manifest(directory, capture.manifest)
    return capture


def test_a_restored_snapshot_captures_back_to_the_same_group_maps(tmp_path: Path) -> None:
    """Snapshot, restore, snapshot again: the per-group maps the files hold (origins,
    prompt identities, finalizer rewards and metrics, canonical attempt ids) are
    unchanged, and the replay-buffer and controller files are byte for byte the same."""
    config = small_config(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"

    async def main() -> tuple[RolloutStateCapture, RolloutStateCapture]:
        parts = build_parts(config, dataset=dataset_of(config))
        await _fill(parts)
        written = await _write(parts, first)
        _close(parts)
        snapshot = read_snapshot(
            first, written.manifest, generations_per_group=written.generations_per_group
        )
        restored = build_parts(config, dataset=dataset_of(config))
        restorer = RolloutRestorer(
            restored,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=ResumeSource(RestoreMode.LATEST, 0, snapshot, None),
        )
        await restorer.restore()
        restored.logs.sequence.value = parts.logs.sequence.value  # restore logged a line
        again = await _write(restored, second)
        _close(restored)
        return written, again

    written, again = asyncio.run(main())
    assert len(written.replay.canonical_attempts) == 2
    assert len(written.controller.origins) == 4
    for capture in (written, again):
        assert all(len(ids) == 4 for ids in capture.replay.canonical_attempts.values())
    assert written.controller.origins == again.controller.origins
    assert written.controller.prompt_identities == again.controller.prompt_identities
    for key in ("finalizer_rewards_by_group", "finalizer_metrics_by_group"):
        assert written.recovery_state[key] == again.recovery_state[key]
        assert len(written.recovery_state[key]) == 2
    for name in (REPLAY_BUFFER_METADATA_FILENAME, CONTROLLER_STATE_FILENAME):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def _close(parts: RolloutParts) -> None:
    """Close what a run would: the logs, and the seal journal (so that the next parts
    on the same directory read every record it took; a real run holds the run lock)."""
    parts.logs.close()
    if parts.seal_journal is not None:
        parts.seal_journal.close()


def _mutable_parts(value: object, path: str) -> list[str]:
    """Where ``value`` holds something that can change in place (a list, dict, set or
    a Struct that is not frozen)."""
    if isinstance(value, list | dict | set | bytearray):
        return [f"{path}: {type(value).__name__}"]
    if isinstance(value, tuple):
        return [p for i, item in enumerate(value) for p in _mutable_parts(item, f"{path}[{i}]")]
    if isinstance(value, msgspec.Struct):
        if not value.__struct_config__.frozen:
            return [f"{path}: {type(value).__name__} is not frozen"]
        return [
            p
            for name in value.__struct_fields__
            for p in _mutable_parts(getattr(value, name), f"{path}.{name}")
        ]
    assert isinstance(value, str | int | float | bool | None), f"{path}: {type(value)}"
    return []


def test_what_the_finalizer_records_and_a_restore_reloads_cannot_change_in_place(
    tmp_path: Path,
) -> None:
    """A snapshot's capture holds references to the finalized entries and encodes them
    after the cut: they must be immutable all the way down, as finalized and as restored."""
    config = small_config(tmp_path)

    async def main() -> tuple[list[FinalizedGroup], list[FinalizedGroup]]:
        parts = build_parts(config, dataset=dataset_of(config))
        await _fill(parts)
        async with parts.cut.checkpoint():
            cut = take_cut_capture(parts)
        captured = [e.finalized for e in cut.groups.values() if e.finalized is not None]
        written = await _write(parts, tmp_path / "snapshot")
        _close(parts)
        snapshot = read_snapshot(
            tmp_path / "snapshot",
            written.manifest,
            generations_per_group=written.generations_per_group,
        )
        restored = build_parts(config, dataset=dataset_of(config))
        await RolloutRestorer(
            restored,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=ResumeSource(RestoreMode.LATEST, 0, snapshot, None),
        ).restore()
        _close(restored)
        reloaded = [e.finalized for e in restored.groups.values() if e.finalized is not None]
        return captured, reloaded

    captured, reloaded = asyncio.run(main())
    assert len(captured) == len(reloaded) == 2
    for index, finalized in enumerate([*captured, *reloaded]):
        assert _mutable_parts(finalized, f"finalized[{index}]") == []
        assert len(finalized.rewards) == config.grpo.num_generations_per_prompt
        assert dict(finalized.metrics) == finalized.metrics_dict()
    assert set(reloaded) == set(captured)  # frozen, so hashable


class TornPublication(RuntimeError):
    pass


async def _tear_publication(parts: RolloutParts, group_id: str, *, rows_put: int) -> None:
    """Finalize ``group_id`` but let the publication break after ``rows_put`` canonical
    rows (all of them: the staging clear after them breaks), as an external data plane
    interrupted mid-publication would, and mark the group ``finalization_unknown``."""
    data_plane = parts.data_plane
    put, clear = data_plane.put, data_plane.clear

    async def torn_put(partition: str, rows: Mapping[str, Any]) -> None:
        if partition != TRAIN_PARTITION:
            await put(partition, rows)
            return
        await put(partition, dict(list(rows.items())[:rows_put]))
        if rows_put < len(rows):
            raise TornPublication("put interrupted")

    async def torn_clear(partition: str, keys: Iterable[str]) -> None:
        if partition == STAGING_PARTITION:
            raise TornPublication("clear interrupted")
        await clear(partition, keys)

    data_plane.put, data_plane.clear = torn_put, torn_clear  # type: ignore[method-assign]
    try:
        with pytest.raises(TornPublication):
            await Finalizer(parts, end_weight_version={}).finalize(group_id)
    finally:
        data_plane.put, data_plane.clear = put, clear  # type: ignore[method-assign]
    assert parts.ledger.get_group(group_id).status is PromptGroupStatus.FINALIZING
    async with parts.cut.mutation():  # the outcome is unknown: snapshots may be taken
        parts.ledger.mark_finalization_unknown(parts.cut, group_id)


def _list_in_sidecar(snapshot: Path, group_id: str) -> None:
    """Give ``group_id`` the finalizer rewards and metrics a canonical group has, on disk."""
    state = read_sidecar(snapshot)
    state["finalizer_rewards_by_group"][group_id] = [msgspec.to_builtins(FINALIZED.rewards[0])] * 4
    state["finalizer_metrics_by_group"][group_id] = FINALIZED.metrics_dict()
    rewrite_sidecar(snapshot, state)


def _listed(snapshot: LoadedSnapshot, group_id: str, origin: GroupOrigin) -> LoadedSnapshot:
    """``snapshot`` doctored so that its replay index also lists ``group_id`` (in memory:
    verification refuses it on disk, its canonical rows are missing)."""
    entry = ReplayEntry(
        group_id=group_id,
        sample_id=str(origin.dataset_idx),
        epoch=origin.epoch,
        start_weight_version=0,
        end_weight_version=0,
        target_step=1,
    )
    replay = snapshot.replay.replay
    ids = [f"{group_id}_g{index}_a0" for index in range(4)]
    return dataclasses.replace(
        snapshot,
        replay=msgspec.structs.replace(
            snapshot.replay,
            replay=msgspec.structs.replace(replay, entries=(*replay.entries, entry)),
            canonical_attempts={**snapshot.replay.canonical_attempts, group_id: ids},
        ),
    )


@pytest.mark.parametrize(("rows_put", "listed"), [(4, False), (2, False), (2, True)])
def test_finalization_unknown_is_resolved_by_the_canonical_rows_not_the_replay_index(
    tmp_path: Path, rows_put: int, listed: bool
) -> None:
    """A snapshot of a torn publication: the group is in the ledger, not in the replay
    index. All its rows exist: published, they are kept and the next finalization puts
    the same rows again (a no-op) and indexes the group. Some missing: cleared, redone,
    even when a doctored (unverified) snapshot also lists the group in the index."""
    config = small_config(tmp_path)
    siblings = config.grpo.num_generations_per_prompt
    keys: list[str] = []

    async def main() -> tuple[dict[str, Any], dict[str, Any], set[str], bool]:
        parts = build_parts(config, dataset=dataset_of(config))
        gate = SimulatedGate(config.gate.simulated, parts.data_plane, ParityEnvironment(), seed=0)
        group_id = await _reserve(parts, sealed=siblings, gate=gate)
        keys.extend(train_key(group_id, index) for index in range(siblings))
        await _tear_publication(parts, group_id, rows_put=rows_put)
        torn = dict(await parts.data_plane.get(TRAIN_PARTITION, keys[:rows_put]))
        written = await _write(parts, tmp_path / "snapshot")
        _close(parts)
        if listed:
            _list_in_sidecar(tmp_path / "snapshot", group_id)
        snapshot = read_snapshot(
            tmp_path / "snapshot", written.manifest, generations_per_group=siblings
        )
        assert group_id not in {e.group_id for e in snapshot.replay.replay.entries}
        if listed:
            snapshot = _listed(snapshot, group_id, parts.group(group_id).origin)
        restored = build_parts(config, dataset=dataset_of(config))
        await RolloutRestorer(
            restored,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=ResumeSource(RestoreMode.LATEST, 0, snapshot, None),
        ).restore()
        after_restore = set(restored.data_plane.keys(TRAIN_PARTITION))
        status = restored.ledger.get_group(group_id).status
        assert status is PromptGroupStatus.FINALIZATION_UNKNOWN
        await Finalizer(restored, end_weight_version={}).finalize(group_id)
        final = dict(await restored.data_plane.get(TRAIN_PARTITION, keys))
        indexed = group_id in restored.replay and group_id not in restored.ledger
        _close(restored)
        return torn, final, after_restore, indexed

    torn, final, after_restore, indexed = asyncio.run(main())
    if rows_put == siblings:
        assert after_restore == set(keys), "the published rows were not kept"
    else:
        assert after_restore == set(), "the rows of a torn publication were not cleared"
    assert indexed and set(final) == set(keys)
    for key, row in torn.items():  # finalizing again puts exactly what was published
        assert {name: np.asarray(value).tolist() for name, value in final[key].items()} == {
            name: np.asarray(value).tolist() for name, value in row.items()
        }
