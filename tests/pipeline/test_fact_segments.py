"""The per-group facts written once (issue 16): each group's origin and prompt identity and
each canonical group's finalization go once per anchor into fact segments that
``group_facts.json`` indexes. A snapshot writes only facts new since the one before, a
restart's first snapshot writes only what the restart added, the restored maps are the
run's, retention keeps exactly what kept snapshots reference, a missing or damaged fact
segment or index rejects its snapshot (restore falls back), sparse and small segments are
merged away, and snapshots of the files before group facts still load."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pipeline_helpers import dataset_of, small_config
from segment_damage import DAMAGES, assert_restore_falls_back, damage_segment
from snapshot_versions import advertise_sidecar, facts_to_form_1, facts_to_inline
from test_group_entries import _reserve
from test_incremental_snapshots import SIBLINGS, Run, verified_resume

from rollvault.checkpoint_tools.inventory import SnapshotKind, read_snapshot_entry
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin, RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots import fact_index, fact_writer
from rollvault.controller.snapshots.fact_forms import (
    FACT_SEGMENT_SUFFIX,
    FACT_SEGMENT_SUFFIXES,
    JSON_FACT_SEGMENT_SUFFIX,
    FinalizedFact,
    OriginFact,
    ReplayFact,
    decode_fact_segment,
)
from rollvault.controller.snapshots.fact_index import GROUP_FACTS_FILENAME, encode_group_facts_file
from rollvault.controller.snapshots.fact_segments import read_group_facts
from rollvault.controller.snapshots.fact_writer import FactSeed, FactSegmentWriter
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import (
    ResumeSource,
    prepare_checkpoint_dir,
    run_fingerprint,
)
from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    DATA_PLANE_DIRNAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    SIDECARS_METADATA_KEY,
    LoadedSnapshot,
    read_snapshot_files,
    segments_dir_for,
)
from rollvault.controller.snapshots.verification import (
    ProblemKind,
    VerificationLevel,
    verify_snapshot,
)
from rollvault.dataplane.checkpoint_format import decode_envelope, replace_user_metadata
from rollvault.dataplane.live_ordinals import encode_live_bitmap
from rollvault.dataplane.segmented_writer import row_bytes
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.ledger.reward_penalties import FinalizedReward
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.training.recording import RecordingTrainer


def _config(tmp_path: Path) -> RunConfig:
    return small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")


_REF_FIELDS = ("file", "sha256", "byte_size", "fact_count", "live_facts", "live")


def _index(snapshot: Path) -> dict[str, Any]:
    """The snapshot's ``group_facts.json`` as builtins, each segment as an object (version
    2 writes each as an array of the same fields; version 3 as a compact array, given here
    as the module reads it)."""
    path = snapshot / GROUP_FACTS_FILENAME
    index: dict[str, Any] = json.loads(path.read_bytes())
    if index["schema_version"] == 2:
        rows = index["segments"]
        assert all(isinstance(row, list) for row in rows)
        index["segments"] = [dict(zip(_REF_FIELDS, row, strict=True)) for row in rows]
    elif index["schema_version"] == 3:
        assert all(isinstance(row, list) and len(row) == 5 for row in index["segments"])
        decoded = fact_index.decode_group_facts_file(path, path.read_bytes())
        index["segments"] = msgspec.to_builtins(decoded.segments)
    elif index["schema_version"] in (4, 5):
        # Each segment [name, live], its row in a catalog (5: all-live ones in runs).
        assert all(isinstance(row, list) and len(row) == 2 for row in index["segments"])
        index.pop("whole", None)
        decoded = fact_index.decode_group_facts_file(
            path, path.read_bytes(), segments_dir_for(snapshot)
        )
        index["segments"] = msgspec.to_builtins(decoded.segments)
        del index["catalogs"]  # the rows are in the segments now, as version 1's
    return index


def _as_version_3(snapshot: Path) -> dict[str, Any]:
    """The snapshot's ``group_facts.json`` (version 4) as version 3, what main wrote before
    fact catalogs: each segment's row in the index (builtins)."""
    path = snapshot / GROUP_FACTS_FILENAME
    decoded = fact_index.decode_group_facts_file(
        path, path.read_bytes(), segments_dir_for(snapshot)
    )
    index: dict[str, Any] = json.loads(encode_group_facts_file(decoded))
    assert index["schema_version"] == 3
    return index


def _fact_files(snapshot: Path) -> set[str]:
    return {ref["file"] for ref in _index(snapshot)["segments"]}


_KINDS = {OriginFact: "origin", FinalizedFact: "finalized", ReplayFact: "replay"}


def _facts_in(snapshot: Path, file: str) -> list[tuple[str, str]]:
    """(kind, group id) of each fact of the segment ``file`` (of either form)."""
    form = 1 if file.endswith(JSON_FACT_SEGMENT_SUFFIX) else 2
    facts = decode_fact_segment((segments_dir_for(snapshot) / file).read_bytes(), form=form)
    return [(_KINDS[type(fact)], fact.group_id) for fact in facts]


def _on_disk(snapshot: Path) -> set[str]:
    return {
        p.name
        for p in segments_dir_for(snapshot).iterdir()
        if p.name.endswith(FACT_SEGMENT_SUFFIXES)
    }


def _loaded(snapshot: Path) -> LoadedSnapshot:
    return read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))


def _maps(snapshot: LoadedSnapshot) -> dict[str, Any]:
    """The per-group maps a snapshot gives restore, whatever files hold them."""
    return {
        "origins": snapshot.controller.origins,
        "identities": snapshot.controller.prompt_identities,
        "attempts": snapshot.replay.canonical_attempts,
        "rewards": snapshot.recovery.finalizer_rewards_by_group,
        "metrics": snapshot.recovery.finalizer_metrics_by_group,
        "replay": list(snapshot.replay.replay.entries),
    }


def _live_maps(parts: RolloutParts) -> dict[str, Any]:
    finalized = {g: e.finalized for g, e in parts.groups.items() if e.finalized is not None}
    return {
        "origins": {g: e.origin for g, e in parts.groups.items()},
        "identities": {
            g: parts.dataset.identity(e.origin.dataset_idx) for g, e in parts.groups.items()
        },
        "attempts": {g: list(f.gate_rollout_ids) for g, f in finalized.items()},
        "rewards": {g: list(f.rewards) for g, f in finalized.items()},
        "metrics": {g: f.metrics_dict() for g, f in finalized.items()},
        "replay": list(parts.replay),
    }


def test_each_snapshot_writes_only_the_facts_new_since_the_one_before(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        finalizer = Finalizer(parts, end_weight_version={})
        a, b = [await _reserve(parts, sealed=SIBLINGS, gate=run.gate) for _ in range(2)]
        await finalizer.finalize(a)
        first = await run.snapshot()
        (whole,) = _fact_files(first)
        assert sorted(_facts_in(first, whole)) == sorted(
            [("origin", a), ("origin", b), ("finalized", a), ("replay", a)]
        )
        assert _maps(_loaded(first)) == _live_maps(parts)
        controller = json.loads((first / CONTROLLER_STATE_FILENAME).read_bytes())
        replay = json.loads((first / REPLAY_BUFFER_METADATA_FILENAME).read_bytes())
        sidecar = json.loads((first / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
        assert (controller["schema_version"], replay["schema_version"]) == (5, 3)
        assert "origins" not in controller and "canonical_attempts" not in replay
        assert replay == {"schema_version": 3, "index_schema_version": 1, "order": [[0, 1]]}
        assert sidecar["schema_version"] == 10 and "finalizer_rewards_by_group" not in sidecar
        await finalizer.finalize(b)
        c = await _reserve(parts, sealed=0, gate=run.gate)
        second = await run.snapshot()
        (new,) = _fact_files(second) - {whole}
        # Nothing else again: b's replay entry is new, a's is where it was.
        assert _facts_in(second, new) == [("origin", c), ("finalized", b), ("replay", b)]
        assert whole in _fact_files(second)
        assert _maps(_loaded(second)) == _live_maps(parts)
        await _reserve(parts, sealed=1, gate=run.gate)  # sealing changes no fact
        third = await run.snapshot()
        assert len(_fact_files(third) - _fact_files(second)) == 1
        parts.logs.close()
        for snapshot in (second, third):
            verification = verify_snapshot(
                snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
            )
            assert verification.ok, verification.problems
        # keep_latest_k=2: the first snapshot is gone, its segment is not (still referenced).
        assert _on_disk(third) == _fact_files(second) | _fact_files(third)
        assert whole in _on_disk(third)

    asyncio.run(main())


def test_a_restart_s_first_snapshot_writes_only_the_facts_the_restart_added(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def write() -> None:
        run = Run.fresh(config)
        finalizer = Finalizer(run.parts, end_weight_version={})
        await finalizer.finalize(await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate))
        await _reserve(run.parts, sealed=1, gate=run.gate)
        await run.snapshot()
        run.parts.logs.close()

    asyncio.run(write())
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    restored = _fact_files(source.snapshot.path)

    async def restart() -> None:
        run = await Run.restored(config, source)
        parts = run.parts
        after = await run.snapshot()  # the restart changed the ledger, no fact
        assert _fact_files(after) == restored
        added = await _reserve(parts, sealed=0, gate=run.gate)
        again = await run.snapshot()
        (new,) = _fact_files(again) - restored
        assert _facts_in(again, new) == [("origin", added)]
        assert _maps(_loaded(again)) == _live_maps(parts)
        parts.logs.close()

    asyncio.run(restart())


def _two_snapshots(config: RunConfig) -> tuple[Path, Path]:
    async def write() -> tuple[Path, Path]:
        run = Run.fresh(config)
        finalizer = Finalizer(run.parts, end_weight_version={})
        await finalizer.finalize(await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate))
        older = await run.snapshot()
        await finalizer.finalize(await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate))
        newest = await run.snapshot()
        run.parts.logs.close()
        return older, newest

    return asyncio.run(write())


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_missing_or_damaged_fact_segment_rejects_its_snapshot_and_restore_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    (only_newest,) = _fact_files(newest) - _fact_files(older)
    segment = segments_dir_for(newest) / only_newest
    expected = damage_segment(segment, damage, flip=(b"reward_mean", b"reward_meaN"), kind="fact")
    assert_restore_falls_back(
        config, older=older, newest=newest, segment=segment, expected=expected, caplog=caplog
    )
    # `rollvault inspect` lists the snapshot with the damaged segment named, and the older
    # one as whole.
    entry = read_snapshot_entry(newest, SnapshotKind.ROLLOUT_SNAPSHOT, now=0.0)
    assert entry.damage is not None and entry.damage.path == str(segment)
    assert expected in entry.damage.problem
    whole = read_snapshot_entry(older, SnapshotKind.ROLLOUT_SNAPSHOT, now=0.0)
    assert whole.damage is None and whole.contents is not None
    assert whole.contents.canonical_groups == 1


def _rewrite_index(snapshot: Path, index: dict[str, Any]) -> str:
    """Write ``index`` as the snapshot's ``group_facts.json``, advertised anew, and return
    the one problem a restorable verification finds."""
    _write_index(snapshot, index)
    verification = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    return f"{problem.path.name}: {problem.problem}"


def _write_index(snapshot: Path, index: dict[str, Any]) -> None:
    """Write ``index`` (segments as objects for version 2) as the snapshot's
    ``group_facts.json`` and advertise it anew in the data plane's metadata."""
    if index["schema_version"] == 2:
        rows = [[ref[name] for name in _REF_FIELDS] for ref in index["segments"]]
        index = dict(index, segments=rows)
    data = msgspec.json.encode(index)
    (snapshot / GROUP_FACTS_FILENAME).write_bytes(data)
    metadata_path = snapshot / DATA_PLANE_DIRNAME / "metadata.json"
    _version, content = decode_envelope(metadata_path.read_bytes(), metadata_path)
    user_metadata = json.loads(content)["user_metadata"]
    advertised = user_metadata[SIDECARS_METADATA_KEY][GROUP_FACTS_FILENAME]
    advertised["sha256"] = hashlib.sha256(data).hexdigest()
    advertised["schema_version"] = index["schema_version"]
    metadata_path.write_bytes(
        replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    )


def test_an_index_whose_bitmap_or_liveness_is_wrong_is_rejected_naming_the_entry(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    index = dict(_index(newest), schema_version=2)  # version 2 records the live count
    index["segments"][0]["live_facts"] += 1
    problem = _rewrite_index(newest, index)
    assert problem.startswith(f"{GROUP_FACTS_FILENAME}: $.segments[0].live: ")
    assert "live_facts records" in problem
    index["segments"][0]["live_facts"] -= 1
    # Well formed, but nothing of the first segment live: its groups lose their facts.
    first = index["segments"][0]
    first.update(live_facts=0, live=encode_live_bitmap(first["fact_count"], []))
    problem = _rewrite_index(newest, index)
    assert problem.startswith(f"{GROUP_FACTS_FILENAME}: holds ")  # not the count advertised
    assert " live facts; " in problem
    assert "data_plane/metadata.json advertises" in problem


def test_a_version_7_sidecar_without_group_facts_is_rejected(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    facts_to_inline(newest)  # the files before group facts: no group_facts.json
    advertise_sidecar(newest, schema_version=7)  # yet the sidecar claims version 7
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.kind is ProblemKind.DAMAGED
    assert problem.path.name == ROLLOUT_RECOVERY_STATE_FILENAME


def test_a_snapshot_of_the_files_before_group_facts_still_restores(tmp_path: Path) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    expected = _maps(_loaded(newest))
    facts_to_inline(newest)  # as the previous writer: controller 4, replay 1, sidecar 6
    assert not (newest / GROUP_FACTS_FILENAME).exists()
    controller = json.loads((newest / CONTROLLER_STATE_FILENAME).read_bytes())
    assert controller["schema_version"] == 4 and controller["origins"]
    loaded = _loaded(newest)
    assert loaded.facts is None and _maps(loaded) == expected
    source = verified_resume(config, newest)

    async def restart() -> None:
        run = await _restored_unseeded(config, source)
        after = await run.snapshot()  # no facts to seed from: every fact written once
        (file,) = _fact_files(after)
        # Two origins, two finalizations, two replay entries.
        assert len(_facts_in(after, file)) == 2 + 2 + 2
        assert _maps(_loaded(after)) == expected
        run.parts.logs.close()

    asyncio.run(restart())
    # Retention reads both forms: the older snapshot's fact segments stay, the rest go.
    collect_segments(newest.parent)
    kept = _fact_files(newest.parent / sorted(p.name for p in newest.parent.glob("snapshot_*"))[-1])
    assert _on_disk(newest) == kept


async def _restored_unseeded(config: RunConfig, source: ResumeSource) -> Run:
    """A restart from a snapshot without group facts: rows and ledger seeded, facts not."""
    parts = build_parts(config, dataset=dataset_of(config))
    restorer = RolloutRestorer(
        parts,
        trainer=RecordingTrainer(),
        buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
        resume=source,
    )
    await restorer.restore()
    assert restorer.fact_seed is None
    run = Run(parts, run_fingerprint(config))
    run.checkpointer.seed_segments(restorer.segment_seed, ledger=restorer.ledger_seed)
    return run


# -- the writer on its own ------------------------------------------------------------


def _origins(ids: range) -> dict[str, GroupOrigin]:
    return {f"g{i}": GroupOrigin(epoch=0, dataset_idx=i) for i in ids}


def _finalized(i: int) -> FinalizedGroup:
    return FinalizedGroup.of(
        rewards=[FinalizedReward(raw_reward=1.0, reward=0.5, masked=False)],
        metrics={"reward_mean": 0.5},
        gate_rollout_ids=[f"g{i}_g0_a{i:032x}"],
    )


def _write(writer: FactSegmentWriter, origins: dict[str, GroupOrigin], stem: str) -> Any:
    pending = writer.write(origins, {}, {}, stem=stem)
    writer.committed(pending)
    return pending


def test_a_sparse_fact_segment_has_its_live_facts_rewritten_and_drops_out(tmp_path: Path) -> None:
    writer = FactSegmentWriter(tmp_path)
    first = _write(writer, _origins(range(4)), "000001")
    assert first.info.new_facts == 4 and first.info.referenced == (
        f"000001-facts{FACT_SEGMENT_SUFFIX}",
    )
    kept = _write(writer, _origins(range(2, 5)), "000002")  # 2 of 4 live: not below half
    assert kept.info.new_facts == 1 and len(kept.info.referenced) == 2
    sparse = _write(writer, _origins(range(3, 5)), "000003")  # 1 of 4 live: rewritten
    assert (sparse.info.new_facts, sparse.info.compacted_facts) == (1, 1)
    assert f"000001-facts{FACT_SEGMENT_SUFFIX}" not in sparse.info.referenced


def test_beyond_the_bound_the_smallest_fact_segments_are_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fact_writer, "MAX_REFERENCED", 4)
    writer = FactSegmentWriter(tmp_path)
    referenced = []
    for step in range(1, 12):  # one new group per snapshot, none ever dies
        pending = _write(writer, _origins(range(step)), f"{step:06d}")
        referenced.append(len(pending.info.referenced))
    assert max(referenced) <= 4 + 1 and referenced[-1] < 11
    path = tmp_path / "index.json"
    data = encode_group_facts_file(pending.index)
    assert read_group_facts(path, data, tmp_path).origins == _origins(range(11))


def test_past_the_due_count_merges_are_spread_by_the_budget_and_the_hard_bound_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four new groups a snapshot, none dying: past the due count each snapshot merges the
    smallest segments only within its budget (its new facts' bytes plus the carry), never
    all at once; the count never passes the hard bound, which forces merges once the
    budget lags; every fact stays readable through the index."""
    monkeypatch.setattr(fact_writer, "DUE_REFERENCED", 4)
    monkeypatch.setattr(fact_writer, "MAX_REFERENCED", 8)
    writer = FactSegmentWriter(tmp_path)
    infos = []
    referenced: tuple[str, ...] = ()
    for step in range(1, 41):
        pending = _write(writer, _origins(range(4 * step)), f"{step:06d}")
        info = pending.info
        infos.append(info)
        assert len(info.referenced) <= 8 and info.merged_bytes <= info.budget
        merged = set(referenced) - set(info.referenced)
        if not info.forced_segments:
            # By choice only: the merged segments' bytes (every fact live, so all of each
            # file) fit in the budget, its own new facts' bytes plus the carry.
            assert sum((tmp_path / file).stat().st_size for file in merged) <= info.budget
        referenced = info.referenced
    # Nothing is merged until 4 are referenced and the new one would pass the due count.
    assert all(info.compacted_facts == 0 for info in infos[:4])
    merging = [step for step, info in enumerate(infos, 1) if info.compacted_facts]
    assert merging and merging[0] == 5
    # The budget lags the doubling sizes; the hard bound then forces merges.
    assert any(info.forced_segments for info in infos)
    data = encode_group_facts_file(pending.index)
    assert read_group_facts(tmp_path / "i.json", data, tmp_path).origins == _origins(range(160))


def test_the_unspent_budget_is_carried_only_by_a_committed_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due merge bigger than one snapshot's budget waits, the unspent budget carried to
    the next snapshot; a write never committed (its snapshot failed) carries nothing."""
    monkeypatch.setattr(fact_writer, "DUE_REFERENCED", 2)
    writer = FactSegmentWriter(tmp_path)
    _write(writer, _origins(range(8)), "000001")  # a big segment: 8 facts
    second = _write(writer, _origins(range(9)), "000002")  # 1 new fact: 2 referenced
    assert second.info.waiting_segments == 0 and len(second.info.referenced) == 2
    # Now 3 would be referenced: the smallest (000002's one fact) fits in one fact's budget.
    third = writer.write(_origins(range(10)), {}, {}, stem="000003")
    assert third.info.compacted_facts == 1 and third.info.waiting_segments == 0
    writer.committed(third)
    # 000003 (2 facts) and 000001 (8): a due merge of 2 facts does not fit one fact's budget.
    fourth = writer.write(_origins(range(11)), {}, {}, stem="000004")
    assert fourth.info.waiting_segments == 1 and fourth.info.compacted_facts == 0
    assert fourth.carry == fourth.info.budget > 0
    # Never committed: the retry starts from the committed state, without the carry.
    retry = writer.write(_origins(range(11)), {}, {}, stem="000005")
    assert retry.info.budget == fourth.info.budget and retry.info.waiting_segments == 1
    writer.committed(retry)
    # 000001 (8 facts), 000003 (2), 000005 (1): the next snapshot's budget is its own new
    # fact's bytes (as the retry's) plus the retry's carry; the smallest fits, 000003 waits.
    fifth = writer.write(_origins(range(12)), {}, {}, stem="000006")
    assert retry.carry > 0 and fifth.info.budget == retry.info.budget + retry.carry
    assert (fifth.info.compacted_facts, fifth.info.waiting_segments) == (1, 1)
    assert "000005-facts" + FACT_SEGMENT_SUFFIX not in fifth.info.referenced


def test_a_due_merge_waits_for_a_snapshot_whose_room_holds_it_and_the_bound_still_forces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The room (the snapshot's headroom within 1.1x its new rows) caps merges by choice: the
    new facts take their bytes of it first; a due merge waits while the rest does not hold
    it, and is made by the first snapshot whose room does. The hard bound forces merges
    even without room."""
    monkeypatch.setattr(fact_writer, "DUE_REFERENCED", 2)
    writer = FactSegmentWriter(tmp_path)
    _write(writer, _origins(range(8)), "000001")
    _write(writer, _origins(range(9)), "000002")  # 2 referenced: 000002 (1 fact) due next

    def write(stem: str, room: int | None) -> Any:
        return writer.write(_origins(range(10)), {}, {}, stem=stem, room=room)

    unbounded = write("000003", None)  # the budget alone merges 000002
    assert unbounded.info.compacted_facts == 1
    one_fact = unbounded.info.segment_bytes  # the new fact and the merged one, ~1 fact each
    tight = write("000004", one_fact // 2)  # the new fact alone takes more than this room
    assert (tight.info.budget, tight.info.compacted_facts, tight.info.waiting_segments) == (
        0,
        0,
        1,
    )
    assert tight.carry == 0  # nothing saved up beyond what the room allowed
    roomy = write("000005", 4 * one_fact)
    assert (roomy.info.compacted_facts, roomy.info.waiting_segments) == (1, 0)
    assert 0 < roomy.info.merged_bytes <= roomy.info.budget <= 4 * one_fact
    writer.committed(roomy)
    # Past the hard bound (3 here) merges happen with no room at all.
    monkeypatch.setattr(fact_writer, "MAX_REFERENCED", 3)
    for step in range(6, 12):
        pending = writer.write(_origins(range(4 + step)), {}, {}, stem=f"{step:06d}", room=0)
        writer.committed(pending)
        assert len(pending.info.referenced) <= 3 and pending.info.merged_bytes == 0
    data = encode_group_facts_file(pending.index)
    assert read_group_facts(tmp_path / "i.json", data, tmp_path).origins == _origins(range(15))


def test_a_snapshot_leaves_the_bytes_it_wrote_after_its_facts_as_the_next_one_s_estimate(
    tmp_path: Path,
) -> None:
    """The room for merges by choice needs the bytes a snapshot writes after its facts are
    chosen (the data plane's index, catalog and the row segments' own overhead, the other
    sidecars, the fact catalog): each committed snapshot leaves exactly those, for the next
    snapshot's estimate. A fresh writer has none (its first snapshot merges nothing by
    choice, see ``write_budget.headroom``)."""
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        await _reserve(parts, sealed=SIBLINGS, gate=run.gate)
        await _reserve(parts, sealed=2, gate=run.gate)
        fresh = FactSegmentWriter(tmp_path / "unused")
        assert fresh.later_bytes is None
        snapshot = await run.snapshot()
        writer = run.checkpointer._facts.for_segments(segments_dir_for(snapshot))
        capture = parts.data_plane.capture()
        new_rows = sum(
            row_bytes(key, row)
            for partition in capture.partitions()
            for key, row in capture.rows(partition).items()
        )
        stem = snapshot.name.rsplit("_", 1)[-1]
        own = [
            path
            for path in snapshot.rglob("*")
            if path.is_file()
            and path.name not in {"manifest.json", ROLLOUT_RECOVERY_STATE_FILENAME}
        ]
        later = [
            path
            for path in segments_dir_for(snapshot).iterdir()
            if path.name.startswith(stem)
            and path.name.endswith(("-rows.catalog.json", "-facts.catalog.json", ".safetensors"))
        ]
        assert any(path.name.endswith(".safetensors") for path in later)
        on_disk = sum(path.stat().st_size for path in [*own, *later])
        assert writer.later_bytes == on_disk - new_rows

    asyncio.run(main())


def test_a_seeded_writer_writes_nothing_for_the_facts_it_was_seeded_with(tmp_path: Path) -> None:
    writer = FactSegmentWriter(tmp_path)
    origins = _origins(range(3))
    identities = {g: f"{i:064x}" for i, g in enumerate(origins)}
    finalized = {"g1": _finalized(1)}
    pending = writer.write(origins, identities, finalized, stem="000001")
    writer.committed(pending)
    loaded = read_group_facts(tmp_path / "i.json", encode_group_facts_file(pending.index), tmp_path)
    assert (loaded.origins, loaded.prompt_identities, loaded.finalized) == (
        origins,
        identities,
        finalized,
    )
    seeded = FactSeed(tmp_path, loaded).writer()
    # Equal values, not the same objects (as after a restore): nothing is written.
    again = seeded.write(_origins(range(3)), dict(identities), {"g1": _finalized(1)}, stem="2")
    assert again.info.new_facts == 0 and again.index == pending.index
    changed = seeded.write(_origins(range(3)), identities, {"g1": _finalized(2)}, stem="000003")
    assert changed.info.new_facts == 1  # a group finalized again differently: written anew


def test_a_snapshot_of_form_1_fact_segments_restores_and_its_segment_stays_referenced(
    tmp_path: Path,
) -> None:
    """The writer before form 2: group facts version 1 over a JSON segment, replay entries in
    ``replay_buffer_metadata.json`` version 2. It restores to the same maps and entries, and
    the restart's next snapshot references that segment (its facts unchanged) and writes
    only the replay entries, in a form 2 segment."""
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    expected = _maps(_loaded(newest))
    old_segment = facts_to_form_1(newest)
    assert _index(newest)["schema_version"] == 1
    replay = json.loads((newest / REPLAY_BUFFER_METADATA_FILENAME).read_bytes())
    assert replay["schema_version"] == 2 and len(replay["replay"]["entries"]) == 2
    loaded = _loaded(newest)
    assert loaded.facts is not None and loaded.facts.replay == []
    assert _maps(loaded) == expected
    source = verified_resume(config, newest)

    async def restart() -> None:
        run = await Run.restored(config, source)
        after = await run.snapshot()
        assert _index(after)["schema_version"] == 5
        assert old_segment in _fact_files(after)
        (new,) = _fact_files(after) - {old_segment}
        assert new.endswith(".facts-segment.msgpack")
        assert sorted(kind for kind, _group in _facts_in(after, new)) == ["replay", "replay"]
        assert _maps(_loaded(after)) == expected
        run.parts.logs.close()
        collect_segments(after.parent)
        assert old_segment in _on_disk(after)

    asyncio.run(restart())


def test_a_version_3_replay_order_that_is_not_each_live_entry_once_is_rejected(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    path = newest / REPLAY_BUFFER_METADATA_FILENAME
    replay = json.loads(path.read_bytes())
    assert replay["order"] == [[0, 2]]
    for order in ([[0, 1]], [[0, 1], [0, 1]], [[1, 2]]):
        data = msgspec.json.encode(dict(replay, order=order))
        path.write_bytes(data)
        advertised_sha = hashlib.sha256(data).hexdigest()
        metadata_path = newest / DATA_PLANE_DIRNAME / "metadata.json"
        _version, content = decode_envelope(metadata_path.read_bytes(), metadata_path)
        user_metadata = json.loads(content)["user_metadata"]
        user_metadata[SIDECARS_METADATA_KEY][REPLAY_BUFFER_METADATA_FILENAME]["sha256"] = (
            advertised_sha
        )
        metadata_path.write_bytes(
            replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
        )
        verification = verify_snapshot(
            newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
        )
        (problem,) = verification.problems
        assert problem.path == path
        assert "$.order: " in problem.problem and "live replay entries" in problem.problem


def test_an_unknown_group_facts_version_is_refused_naming_file_and_version(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    index = dict(_index(newest), schema_version=2)
    index["schema_version"] = 6
    problem = _rewrite_index(newest, index)
    assert (
        problem
        == f"{GROUP_FACTS_FILENAME}: unsupported schema_version 6 (supported: 1, 2, 3, 4, 5)"
    )


def test_version_3_rows_are_compact_and_read_back_to_the_same_references(tmp_path: Path) -> None:
    """Version 3: a segment of this writer is named by its sequence number, any other by its
    file name; the digest is raw; all live is ``[]``, else runs or a bitmap. Each row reads
    back to the reference written, about half version 2's bytes."""
    refs = [
        fact_index.FactSegmentRef(
            file=name,
            sha256=hashlib.sha256(name.encode()).hexdigest(),
            byte_size=1000 + position,
            fact_count=count,
            live_facts=len(held),
            live=encode_live_bitmap(count, held),
        )
        for position, (name, count, held) in enumerate(
            [
                (f"000007-facts{FACT_SEGMENT_SUFFIX}", 24, list(range(24))),
                ("snapshot_000003-form1.facts-segment.json", 100, list(range(50))),
                (f"7-facts{FACT_SEGMENT_SUFFIX}", 9, list(range(0, 9, 2))),  # not zero-padded
                (f"1234567-facts{FACT_SEGMENT_SUFFIX}", 3, [1]),
            ]
        )
    ]
    index = fact_index.GroupFactsFile(schema_version=3, segments=refs)
    data = encode_group_facts_file(index)
    rows = json.loads(data)["segments"]
    assert [row[0] for row in rows] == [
        7,
        "snapshot_000003-form1.facts-segment.json",
        f"7-facts{FACT_SEGMENT_SUFFIX}",
        1234567,
    ]
    assert rows[0][4] == [] and rows[1][4] == [50, 50]  # all live; runs
    assert rows[2][4] == base64.b64encode(bytes([0b01010101, 1])).decode()  # the bitmap
    assert fact_index.decode_group_facts_file(tmp_path / "i.json", data) == index
    # The common row, an all-live segment of this writer: about half version 2's.
    row_2 = msgspec.json.encode([getattr(refs[0], field) for field in _REF_FIELDS])
    assert len(msgspec.json.encode(rows[0])) < 0.55 * len(row_2)


def test_a_version_3_row_whose_live_runs_do_not_fit_is_refused_naming_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    index = _as_version_3(newest)
    count = index["segments"][0][3]
    index["segments"][0][4] = [count - 1, 2]  # runs adding up past the segment's facts
    problem = _rewrite_index(newest, index)
    assert problem.startswith(f"{GROUP_FACTS_FILENAME}: $.segments[0][4] (live): runs add up")


def test_a_version_3_row_naming_the_writer_s_segment_as_text_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """A segment of this writer is named by its number: its file name as text is refused."""
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    index = _as_version_3(newest)
    number = index["segments"][0][0]
    assert isinstance(number, int)
    index["segments"][0][0] = f"{number:06d}-facts{FACT_SEGMENT_SUFFIX}"
    problem = _rewrite_index(newest, index)
    assert problem.startswith(f"{GROUP_FACTS_FILENAME}: [0] (name): the text ")
    assert problem.endswith(f"sequence number {number} is due - at `$.segments[0]`")


def test_a_version_2_group_facts_as_main_wrote_it_restores_and_the_next_snapshot_writes_3(
    tmp_path: Path,
) -> None:
    """The writer before version 3 wrote each segment as a version 2 row: such a snapshot
    verifies and restores to the same maps, and the restart's next snapshot writes version 3
    referencing the same segments (none of its facts written again but the restart's)."""
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    expected = _maps(_loaded(newest))
    files = _fact_files(newest)
    index = dict(_index(newest), schema_version=2)
    _write_index(newest, index)
    assert json.loads((newest / GROUP_FACTS_FILENAME).read_bytes())["schema_version"] == 2
    assert _maps(_loaded(newest)) == expected
    source = verified_resume(config, newest)

    async def restart() -> None:
        run = await Run.restored(config, source)
        after = await run.snapshot()
        assert _index(after)["schema_version"] == 5
        assert files <= _fact_files(after)
        assert _maps(_loaded(after)) == expected
        run.parts.logs.close()

    asyncio.run(restart())


# -- version 4: the segments' rows in fact catalogs -------------------------------------


def _raw_index(snapshot: Path) -> dict[str, Any]:
    index: dict[str, Any] = json.loads((snapshot / GROUP_FACTS_FILENAME).read_bytes())
    return index


def _as_version_4(snapshot: Path) -> dict[str, Any]:
    """The snapshot's ``group_facts.json`` (version 5) as version 4, what main wrote before
    the runs: every segment held as ``[name, live]`` in file-name order (builtins)."""
    index = _raw_index(snapshot)
    assert index["schema_version"] == 5
    numbers = [n for first, count in index["whole"] for n in range(first, first + count)]
    held = [[n, []] for n in numbers] + index["segments"]
    held.sort(key=lambda entry: fact_index.fact_segment_file_from_name(entry[0]))
    return {"schema_version": 4, "catalogs": index["catalogs"], "segments": held}


def test_version_5_lists_the_all_live_segments_as_runs_and_reads_back_what_4_and_3_give(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    expected = _maps(_loaded(newest))
    index = _raw_index(newest)
    assert index["schema_version"] == 5
    # Both segments' facts all live: one run, no entry; the older one's row is in the older
    # snapshot's catalog, written once, the new one's in this snapshot's.
    assert (index["whole"], index["segments"]) == ([[1, 2]], [])
    assert [catalog[0] for catalog in index["catalogs"]] == [1, 2]
    assert _raw_index(older)["catalogs"][0] == index["catalogs"][0]
    # Version 4 (each segment by number and live facts), what main wrote before the runs,
    # reads the same, and so does version 3 (each row in the index, before catalogs).
    version_4 = _as_version_4(newest)
    assert all(isinstance(name, int) for name, _live in version_4["segments"])
    assert len(version_4["segments"]) == 2
    _write_index(newest, version_4)
    assert _maps(_loaded(newest)) == expected
    _write_index(newest, _as_version_3(newest))
    assert _maps(_loaded(newest)) == expected


def _recatalog(snapshot: Path, change: Any) -> str:
    """Rewrite the snapshot's newest catalog changed by ``change``, record its new bytes in
    the index (so only the content is wrong), and return the problem verification finds."""
    index = _raw_index(snapshot)
    ref = index["catalogs"][-1]
    path = segments_dir_for(snapshot) / f"{ref[0]:06d}{fact_index.FACT_CATALOG_SUFFIX}"
    content = json.loads(path.read_bytes())
    change(content)
    data = json.dumps(content).encode()
    path.write_bytes(data)
    ref[1] = base64.b64encode(hashlib.sha256(data).digest()).decode()
    ref[2] = len(data)
    return _rewrite_index(snapshot, index)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c.update(schema_version=2), "$.schema_version: 2; this build reads catalog"),
        (lambda c: c.update(extra=1), "unknown field `extra`"),
        (lambda c: c["entries"][0].__setitem__(1, "AAAA"), "$.entries[0][1]"),
        (lambda c: c["entries"].append(c["entries"][0]), "holds 2 entries, group_facts.json"),
    ],
)
def test_a_fact_catalog_whose_content_is_wrong_is_refused_naming_it(
    tmp_path: Path, change: Any, expected: str
) -> None:
    _older, newest = _two_snapshots(_config(tmp_path))
    problem = _recatalog(newest, change)
    assert problem.startswith("000002-facts.catalog.json: ") and expected in problem, problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda i: i["catalogs"].append(i["catalogs"][0]), "$.catalogs[2]: catalog "),
        (lambda i: i["catalogs"].pop(0), "$.segments[0][0] (name): segment "),
        (lambda i: i["segments"].append(i["segments"][0]), "listed twice"),
        (lambda i: i["catalogs"][0].__setitem__(2, 1), "size"),
    ],
)
def test_an_index_that_does_not_match_its_fact_catalogs_is_refused_naming_the_field(
    tmp_path: Path, change: Any, expected: str
) -> None:
    """Version 4 (as main wrote it: an entry per segment)."""
    _older, newest = _two_snapshots(_config(tmp_path))
    index = _as_version_4(newest)
    change(index)
    problem = _rewrite_index(newest, index)
    assert expected in problem, problem


def test_a_missing_fact_catalog_is_refused_naming_it(tmp_path: Path) -> None:
    _older, newest = _two_snapshots(_config(tmp_path))
    (segments_dir_for(newest) / f"000002{fact_index.FACT_CATALOG_SUFFIX}").unlink()
    index = _raw_index(newest)
    problem = _rewrite_index(newest, index)  # advertised anew: the catalog is what is wrong
    assert problem.startswith("000002-facts.catalog.json: missing fact catalog"), problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda i: i.update(whole=[[1, 1], [2, 1]]), "$.whole[1]: the run from 2 touches"),
        (lambda i: i.update(whole=[[1, 0], [2, 1]]), "$.whole[0]: an empty run (0 numbers)"),
        (lambda i: i.update(whole=[[1, -1]]), "Expected `int` >= 0 - at `$.whole[0][1]`"),
        (
            lambda i: i.update(whole=[[1, 1]], segments=[[2, []]]),
            "$.segments[0]: '000002-facts.facts-segment.msgpack' holds only live entries: its "
            "place is a run",
        ),
        (
            lambda i: i.update(segments=[[1, [0, 1, 1]]]),
            "$.segments[0]: '000001-facts.facts-segment.msgpack' is in a run too",
        ),
        (
            lambda i: i.update(whole=[], segments=[[2, [1, 1]], [1, [1, 1]]]),
            "$.segments[1]: '000001-facts.facts-segment.msgpack' is not after",
        ),
        (
            lambda i: i.update(whole=[[1, 3]]),
            "$.whole (segment 3)[0] (name): segment '000003-facts.facts-segment.msgpack' is in "
            "none of its catalogs",
        ),
    ],
)
def test_a_version_5_index_out_of_its_form_is_refused_naming_the_field(
    tmp_path: Path, change: Any, expected: str
) -> None:
    """One spelling per set of referenced segments: runs maximal and never empty; a
    numbered all-live segment only in a run; the other entries by file name, none in a run
    too; a run naming a segment no catalog describes is refused as an entry would be.
    Retention refuses the same forms (it reads the names only)."""
    _older, newest = _two_snapshots(_config(tmp_path))
    index = _raw_index(newest)
    change(index)
    problem = _rewrite_index(newest, index)
    assert problem.startswith(f"{GROUP_FACTS_FILENAME}: ") and expected in problem, problem
    if "catalogs" in expected:
        return  # the catalogs are read by restore, not by retention
    path = newest / GROUP_FACTS_FILENAME
    with pytest.raises(fact_index.FactsError, match=re.escape(expected)):
        fact_index.referenced_fact_segments(path, path.read_bytes())
