"""The ledger written incrementally (issue 16): each group's record once per change, into
ledger segments that version 6 sidecars index. Unchanged groups cost an index entry, the
restored state is the ledger's, a restart's first snapshot rewrites only what the restart
changed, retention and compaction keep exactly what kept snapshots reference, and a
missing or damaged ledger segment rejects its snapshot, restore falling back."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pipeline_helpers import dataset_of, small_config
from segment_damage import DAMAGES, assert_restore_falls_back, damage_segment
from snapshot_versions import (
    inline_snapshot_to_v5,
    ledger_segments_to_form_1,
    read_sidecar_json,
    rewrite_sidecar,
)
from test_group_entries import _reserve
from test_incremental_snapshots import SIBLINGS, Run, verified_resume

from rollvault.config.schema import RunConfig
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.gate import AttemptRequest
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.snapshots import ledger_segments
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter
from rollvault.controller.snapshots.resume import ResumeSource, prepare_checkpoint_dir
from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import (
    read_snapshot_files,
    segments_dir_for,
)
from rollvault.controller.snapshots.verification import (
    VerificationLevel,
    verify_snapshot,
)
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.snapshot_dirs import committed_snapshot_paths
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.ledger_records import (
    LEDGER_SEGMENT_SUFFIX,
    STATUS_CODE,
    PackedRecordOut,
    RecordChain,
    decode_ledger_segment,
    encode_packed_record,
)
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.ledger.statuses import RolloutAttemptStatus


def _config(tmp_path: Path) -> RunConfig:
    return small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")


def _index(snapshot: Path) -> dict[str, Any]:
    written = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    # 7: the finalizer maps in the group facts; 8: the index's groups as runs too; 9: its
    # segments as compact rows too; 10: those rows in ledger catalogs.
    assert written["schema_version"] in (6, 7, 8, 9, 10)
    index: dict[str, Any] = read_sidecar_json(snapshot)["ledger_index"]
    return index


def _ledger_files(snapshot: Path) -> set[str]:
    return {ref["file"] for ref in _index(snapshot)["segments"]}


def _groups_in(snapshot: Path, file: str) -> list[str]:
    """The group of each record of ``file``, as ``snapshot``'s chains reach them."""
    loaded = read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))
    groups = loaded.recovery.ledger_state["groups"]
    owner = {
        link: group["group_id"]
        for group, chain in zip(groups, loaded.ledger_chains, strict=True)
        for link in chain.links
    }
    count = len(_records_in(snapshot, file))
    return [owner[(file, ordinal)] for ordinal in range(count)]


def _records_in(snapshot: Path, file: str) -> list[Any]:
    """The records of a form 3 ledger segment as builtins: ``[base, header, siblings]``, each
    sibling ``[generation_index, start, attempts]``."""
    assert file.endswith(LEDGER_SEGMENT_SUFFIX)
    form, _bases, records = msgspec.msgpack.decode((segments_dir_for(snapshot) / file).read_bytes())
    assert form == 4
    return list(records)


def _record_bytes(snapshot: Path, file: str) -> list[bytes]:
    """Each record's own bytes in a form 3 ledger segment."""
    data = (segments_dir_for(snapshot) / file).read_bytes()
    return [bytes(raw) for raw in decode_ledger_segment(data, name=file).records]


def _on_disk(snapshot: Path) -> set[str]:
    return {
        p.name
        for p in segments_dir_for(snapshot).iterdir()
        if p.name.endswith(LEDGER_SEGMENT_SUFFIX)
    }


def _restored_ledger(snapshot: Path) -> dict[str, Any]:
    loaded = read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))
    return dict(loaded.recovery.ledger_state)


def _downgraded(
    config: RunConfig, downgrade: Callable[[Path], str], expected: dict[str, Any]
) -> tuple[ResumeSource, str]:
    """The newest snapshot's ledger segments rewritten by ``downgrade`` as an older writer
    wrote them (it returns the segment file it wrote), checked to restore ``expected``
    still, and the resume source read from disk again."""
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    written = downgrade(source.snapshot.path)
    assert _restored_ledger(source.snapshot.path) == expected
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    return source, written


def _live_ledger(parts: RolloutParts) -> dict[str, Any]:
    state = parts.ledger.state_dict()
    canonical = {entry.group_id for entry in parts.replay}
    state["groups"] = [g for g in state["groups"] if g["group_id"] not in canonical]
    return state


async def _seal(parts: RolloutParts, gate: SimulatedGate, group_id: str, index: int) -> None:
    record = parts.ledger.get_group(group_id)
    request = AttemptRequest(
        group_id=group_id,
        generation_index=index,
        gate_rollout_id=record.gate_rollout_id(index),
        prompt=dict(record.prompt_payload),
        weight_version=0,
    )
    outcome = await gate.run_attempt(request)
    async with parts.cut.mutation():
        parts.ledger.mark_sibling_sealed(
            parts.cut,
            group_id,
            generation_index=index,
            gate_rollout_id=request.gate_rollout_id,
            receipt=outcome.receipt,
            reward=outcome.reward,
            mask_sample=False,
            reward_checks=outcome.reward_checks,
            reward_log_context=outcome.reward_log_context,
        )


def test_a_snapshot_writes_the_records_of_changed_groups_only_and_restores_the_ledger(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        finalizer = Finalizer(parts, end_weight_version={})
        a, b, c = [await _reserve(parts, sealed=n, gate=run.gate) for n in (0, 1, SIBLINGS)]
        first = await run.snapshot()
        (whole,) = _ledger_files(first)
        assert _groups_in(first, whole) == [a, b, c]
        assert _restored_ledger(first) == _live_ledger(parts)
        await _seal(parts, run.gate, a, 0)
        d = await _reserve(parts, sealed=0, gate=run.gate)
        second = await run.snapshot()
        (new,) = _ledger_files(second) - {whole}
        assert _groups_in(second, new) == [a, d]  # b and c did not change: not written
        delta, added = _records_in(second, new)
        assert delta[0] == [0, 0] and delta[1] is None  # a's base: whole's first record
        # only the attempt its seal changed: sibling 0's from its first (and only) on
        assert [(index, start, len(attempts)) for index, start, attempts in delta[2]] == [(0, 0, 1)]
        assert added[0] is None and len(added[2]) == SIBLINGS  # d: a whole record
        assert _index(second)["groups"][1:3] == _index(first)["groups"][1:3]
        assert _restored_ledger(second) == _live_ledger(parts)
        await finalizer.finalize(c)  # canonical now: out of the ledger part
        await _seal(parts, run.gate, b, 1)
        third = await run.snapshot()
        (newest,) = _ledger_files(third) - _ledger_files(second)
        assert _groups_in(third, newest) == [b]
        assert len(_index(third)["groups"]) == 3
        assert _restored_ledger(third) == _live_ledger(parts)
        # a's and b's deltas rest on their first records: the first segment stays referenced.
        assert _ledger_files(third) == {whole, new, newest}
        run.parts.logs.close()
        for snapshot in (second, third):
            verification = verify_snapshot(
                snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
            )
            assert verification.ok, verification.problems

    asyncio.run(main())


def test_retention_deletes_a_ledger_segment_once_no_kept_snapshot_references_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sized for compaction due past 0.4 dead and forced past 0.5 (the thresholds then).
    monkeypatch.setattr(ledger_segments, "DEAD_DUE", 0.4)
    monkeypatch.setattr(ledger_segments, "DEAD_FORCED", 0.5)
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        finalizer = Finalizer(parts, end_weight_version={})
        groups = [await _reserve(parts, sealed=SIBLINGS, gate=run.gate) for _ in range(4)]
        first = await run.snapshot()
        (whole,) = _ledger_files(first)
        for group_id in groups:  # its records die one by one
            await finalizer.finalize(group_id)
            await _reserve(parts, sealed=0, gate=run.gate)
            latest = await run.snapshot()
            kept = committed_snapshot_paths(latest.parent)
            assert len(kept) == 2  # keep_latest_k: exactly what the two reference is on disk
            assert _on_disk(latest) == set().union(*(_ledger_files(s) for s in kept))
        assert whole not in _on_disk(latest)
        parts.logs.close()

    asyncio.run(main())


def test_a_sparse_ledger_segment_is_compacted_into_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sized for compaction due past 0.4 dead and forced past 0.5 (the thresholds then).
    monkeypatch.setattr(ledger_segments, "DEAD_DUE", 0.4)
    monkeypatch.setattr(ledger_segments, "DEAD_FORCED", 0.5)
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        finalizer = Finalizer(parts, end_weight_version={})
        done = [await _reserve(parts, sealed=SIBLINGS, gate=run.gate) for _ in range(4)]
        changing, waiting = [await _reserve(parts, sealed=0, gate=run.gate) for _ in range(2)]
        first = await run.snapshot()
        (whole,) = _ledger_files(first)
        await finalizer.finalize(done[0])
        second = await run.snapshot()
        assert whole in _ledger_files(second)  # 5 of 6 live: kept as it is
        for group_id in done[1:]:
            await finalizer.finalize(group_id)
        await _seal(parts, run.gate, changing, 0)
        third = await run.snapshot()  # 2 of 6 live, below half: rewritten
        assert whole not in _ledger_files(third)
        changed, cold = sorted(_ledger_files(third) - _ledger_files(second), reverse=True)
        assert _groups_in(third, changed) == [changing]
        assert _records_in(third, changed)[0][0] is None  # whole, not a delta on a dying base
        assert "-cold-" in cold and _groups_in(third, cold) == [waiting]  # kept apart
        assert _restored_ledger(third) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(main())


def test_a_restart_s_first_snapshot_rewrites_only_the_groups_the_restart_changed(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def write() -> tuple[str, str]:
        run = Run.fresh(config)
        sealed = await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate)  # nothing in flight
        flying = await _reserve(run.parts, sealed=1, gate=run.gate)  # interrupted by the kill
        await run.snapshot()
        run.parts.logs.close()
        return sealed, flying

    sealed, flying = asyncio.run(write())
    source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    restored_files = _ledger_files(source.snapshot.path)

    async def restart() -> None:
        run = await Run.restored(config, source)
        parts = run.parts
        after = await run.snapshot()
        written = [g for f in _ledger_files(after) - restored_files for g in _groups_in(after, f)]
        assert written == [flying]  # its interrupted attempt became a fresh one
        (file,) = _ledger_files(after) - restored_files
        (record,) = _records_in(after, file)
        assert record[0] is not None  # a delta: the sealed sibling is not written again
        assert [patch[0] for patch in record[2]] == list(range(1, SIBLINGS))
        assert sealed in parts.ledger and _restored_ledger(after) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(restart())


def _two_snapshots(config: RunConfig) -> tuple[Path, Path]:
    async def write() -> tuple[Path, Path]:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=2, gate=run.gate)
        older = await run.snapshot()
        await _reserve(run.parts, sealed=1, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return older, newest

    return asyncio.run(write())


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_missing_or_damaged_ledger_segment_rejects_its_snapshot_and_restore_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    (only_newest,) = _ledger_files(newest) - _ledger_files(older)
    segment = segments_dir_for(newest) / only_newest
    expected = damage_segment(segment, damage, flip=(b"sealed", b"failed"), kind="ledger")
    assert_restore_falls_back(
        config, older=older, newest=newest, segment=segment, expected=expected, caplog=caplog
    )


def _sidecar_problem(snapshot: Path, state: dict[str, Any]) -> str:
    """Rewrite ``snapshot``'s sidecar as ``state`` (advertised anew) and return the one problem
    a restorable verification finds, which must be the sidecar's."""
    rewrite_sidecar(snapshot, state)
    verification = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.path == snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    return problem.problem


def test_an_index_naming_a_record_its_segment_lacks_is_rejected_naming_the_entry(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    _older, newest = _two_snapshots(config)
    state = read_sidecar_json(newest)  # version 8 as 7: the index's pairs, one per group
    state["ledger_index"]["groups"][0][1] = 99
    problem = _sidecar_problem(newest, state)  # advertised anew: only the index is wrong
    assert "$.ledger_index.groups[0]: record 99 of" in problem


def test_a_version_5_snapshot_of_the_writer_before_ledger_segments_still_restores(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    expected = _restored_ledger(newest)
    inline_snapshot_to_v5(newest)
    assert "ledger" in json.loads((newest / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    assert _restored_ledger(newest) == expected
    source = verified_resume(config, newest)
    assert source.snapshot is not None and source.snapshot.ledger_index is None
    # Retention reads both versions: the older snapshot's segments stay, the rest go.
    collect_segments(newest.parent)
    assert _on_disk(newest) == _ledger_files(older)


def test_a_writer_given_the_same_records_writes_nothing_new(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=1, gate=run.gate)
        await _reserve(run.parts, sealed=0, gate=run.gate)
        async with run.parts.cut.checkpoint():
            records = run.parts.ledger.capture().shared_groups()
        writer = LedgerSegmentWriter(tmp_path / "segments")
        first = writer.write(records, stem="000001")
        writer.committed(first)
        again = writer.write(records, stem="000002")
        assert first.info.new_records == 2 and again.info.new_records == 0
        assert again.index == first.index and again.info.segment_bytes == 0
        run.parts.logs.close()

    asyncio.run(main())


def test_ledger_segments_are_kept_while_a_committed_snapshot_s_sidecar_is_unreadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path)
    older, newest = _two_snapshots(config)
    sidecar = newest / ROLLOUT_RECOVERY_STATE_FILENAME
    sidecar.write_bytes(b"{damaged")
    orphan = segments_dir_for(newest) / f"000009-ledger{LEDGER_SEGMENT_SUFFIX}"
    orphan.write_bytes(b"{}")
    with caplog.at_level(logging.WARNING, logger="rollvault.checkpointer"):
        assert collect_segments(newest.parent) is None
    assert orphan.exists() and "kept every segment" in caplog.text
    sidecar.unlink()  # no sidecar: never restorable, so it needs no segment
    collect_segments(newest.parent)
    assert not orphan.exists() and _on_disk(newest) == _ledger_files(older)


def test_a_group_s_chain_of_deltas_is_bounded_then_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_segments, "MAX_CHAIN", 2)
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        group = await _reserve(parts, sealed=0, gate=run.gate)
        files = _ledger_files(await run.snapshot())
        bases = []
        for index in range(3):
            await _seal(parts, run.gate, group, index)
            snapshot = await run.snapshot()  # keep_latest_k=2: read each before it goes
            (file,) = _ledger_files(snapshot) - files
            (record,) = _records_in(snapshot, file)
            bases.append(record[0] is not None)
            assert _restored_ledger(snapshot) == _live_ledger(parts)
            files = _ledger_files(snapshot)
        assert bases == [True, False, True]  # delta, whole at the bound, delta on it
        assert len(files) == 2  # the whole one's chain only
        parts.logs.close()

    asyncio.run(main())


def test_snapshots_under_a_small_rewrite_budget_restore_the_ledger_and_keep_what_they_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many snapshots with rewrites due (chains past a low bound, segments past a low dead
    share) and a budget too small for all of them: every snapshot restores the live ledger,
    and retention keeps exactly the ledger segments the kept snapshots reference."""
    monkeypatch.setattr(ledger_segments, "chain_budget", lambda group_id: 0.3)
    monkeypatch.setattr(ledger_segments, "DEAD_DUE", 0.1)
    monkeypatch.setattr(ledger_segments, "REWRITE_SHARE", 0.5)
    written: list[ledger_segments.LedgerWriteInfo] = []
    write = LedgerSegmentWriter.write

    def recording(
        self: LedgerSegmentWriter, records: Any, *, stem: str
    ) -> ledger_segments.PendingLedger:
        pending = write(self, records, stem=stem)
        written.append(pending.info)
        return pending

    monkeypatch.setattr(LedgerSegmentWriter, "write", recording)
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        finalizer = Finalizer(parts, end_weight_version={})
        sealed = {await _reserve(parts, sealed=0, gate=run.gate): 0 for _ in range(6)}
        await run.snapshot()
        for round_ in range(2 * SIBLINGS + 1):  # until every group is sealed and finalized
            for group_id in list(sealed)[round_ % 2 :: 2]:  # half the groups a round
                await _seal(parts, run.gate, group_id, sealed[group_id])
                sealed[group_id] += 1
                if sealed[group_id] == SIBLINGS:
                    await finalizer.finalize(group_id)
                    del sealed[group_id]
            snapshot = await run.snapshot()
            assert _restored_ledger(snapshot) == _live_ledger(parts)
            kept = committed_snapshot_paths(snapshot.parent)
            assert _on_disk(snapshot) == set().union(*(_ledger_files(s) for s in kept))
        parts.logs.close()

    asyncio.run(main())
    assert all(info.rewritten_bytes <= info.budget for info in written)
    # the budget was the limit: some rewrites waited, some were made within it
    assert sum(info.queued_records for info in written) > 0
    assert sum(info.rewritten_bytes for info in written) > 0


def _chain_of(snapshot: Path, group_id: str) -> RecordChain:
    loaded = read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))
    groups = loaded.recovery.ledger_state["groups"]
    (chain,) = [
        c for g, c in zip(groups, loaded.ledger_chains, strict=True) if g["group_id"] == group_id
    ]
    return chain


def test_a_chain_past_its_bound_is_written_whole_at_the_cap_even_with_no_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its bound by bytes a chain is due: it waits for the budget (none here), but only
    until its deltas would pass the bound plus ``CHAIN_BYTES_OVERDUE``: then it is written
    whole whatever the budget (the budget's side: test_ledger_rewrite_budget.py)."""
    bound, overdue = 0.3, 0.3  # a seal's delta here is 0.2-0.3x its group's whole record
    monkeypatch.setattr(ledger_segments, "chain_budget", lambda group_id: bound)
    monkeypatch.setattr(ledger_segments, "CHAIN_BYTES_OVERDUE", overdue)
    monkeypatch.setattr(ledger_segments, "REWRITE_SHARE", 0.0)
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        group = await _reserve(parts, sealed=0, gate=run.gate)
        await run.snapshot()
        lengths, ratios = [], []
        for index in range(SIBLINGS):
            await _seal(parts, run.gate, group, index)
            snapshot = await run.snapshot()
            chain = _chain_of(snapshot, group)
            whole = len(ledger_segments._Encoded.of(parts.ledger.get_group(group)).whole_bytes)
            assert chain.delta_bytes <= (bound + overdue) * whole  # after every snapshot
            lengths.append(len(chain.links))
            ratios.append(chain.delta_bytes / whole)
            assert _restored_ledger(snapshot) == _live_ledger(parts)
        # a delta past the bound (due, no budget), one more, then whole at the cap, then a delta
        assert lengths == [2, 3, 1, 2], (lengths, ratios)
        assert ratios[0] > bound
        parts.logs.close()

    asyncio.run(main())


def test_a_read_chain_counts_its_deltas_bytes_as_the_writer_did_for_a_restart_to_go_on(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        run = Run.fresh(config)
        group = await _reserve(run.parts, sealed=0, gate=run.gate)
        await run.snapshot()
        for index in range(2):
            await _seal(run.parts, run.gate, group, index)
            snapshot = await run.snapshot()
        writer = run.checkpointer._ledger.for_segments(segments_dir_for(snapshot))
        written = writer._placed[group].delta_bytes
        chain = _chain_of(snapshot, group)
        assert len(chain.links) == 3 and chain.delta_bytes == written > 0
        stored = sum(  # the deltas' records, as stored
            len(_record_bytes(snapshot, file)[ordinal]) for file, ordinal in chain.links[:-1]
        )
        assert chain.delta_bytes == stored
        run.parts.logs.close()

    asyncio.run(main())


def test_a_delta_whose_base_segment_the_index_does_not_list_is_rejected(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def write() -> Path:
        run = Run.fresh(config)
        group = await _reserve(run.parts, sealed=1, gate=run.gate)
        await run.snapshot()
        await _seal(run.parts, run.gate, group, 1)
        newest = await run.snapshot()
        run.parts.logs.close()
        return newest

    newest = asyncio.run(write())
    state = read_sidecar_json(newest)
    index = state["ledger_index"]
    ((position, ordinal),) = index["groups"]
    index["segments"] = [index["segments"][position]]  # the base's segment left out
    index["groups"] = [[0, ordinal]]
    problem = _sidecar_problem(newest, state)
    assert "$.ledger_index.groups[0]: the chain reaches ledger segment" in problem
    assert "which the index does not list" in problem


def test_a_snapshot_of_form_1_ledger_segments_restores_and_its_groups_change_whole_first(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def write() -> tuple[str, dict[str, Any]]:
        run = Run.fresh(config)
        group = await _reserve(run.parts, sealed=1, gate=run.gate)
        await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return group, _restored_ledger(newest)

    group, expected = asyncio.run(write())
    # As the writer before deltas.
    source, form_1 = _downgraded(config, ledger_segments_to_form_1, expected)

    async def restart() -> None:
        run = await Run.restored(config, source)
        parts = run.parts
        after = await run.snapshot()
        (file,) = _ledger_files(after) - {form_1}
        assert _groups_in(after, file) == [group]  # the restart changed only it: rewritten
        (record,) = _records_in(after, file)
        assert record[0] is None  # whole: no delta rests on a form 1 record
        assert _restored_ledger(after) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(restart())


@pytest.mark.parametrize("header", ["same", "fields", "whole"])
@pytest.mark.parametrize("base", [(0, 0), (3, 127), (200, 70000)])
def test_a_delta_encoded_once_is_the_record_the_packed_form_encodes(
    header: str, base: tuple[int, int]
) -> None:
    """A delta's pieces are encoded once, when its size is planned; the record written adds
    its base: byte for byte what ``encode_packed_record`` makes of the same record. An
    attempt whose status alone changed is a status patch; a header with one field changed
    is that field, with most changed the header."""
    pieces = tuple(
        tuple(msgspec.msgpack.encode([sibling, attempt, "x" * attempt]) for attempt in range(4))
        for sibling in range(3)
    )
    head = msgspec.msgpack.encode(["header", 1])
    parts = (msgspec.msgpack.encode("header"), msgspec.msgpack.encode(1))
    reserved, dispatched = RolloutAttemptStatus.RESERVED, RolloutAttemptStatus.DISPATCHED
    digests = (parts, tuple(tuple((b"a", reserved) for _ in attempts) for attempts in pieces))
    encoded = ledger_segments._Encoded(head, pieces, digests)
    old_parts = {
        "same": parts,
        "fields": (parts[0], msgspec.msgpack.encode(2)),
        "whole": (msgspec.msgpack.encode("other"), msgspec.msgpack.encode(2)),
    }[header]
    old_keys = (
        ((b"a", dispatched), (b"a", reserved), (b"b", reserved), (b"b", reserved)),
        ((b"a", reserved), (b"a", dispatched), (b"a", reserved), (b"a", reserved)),
        ((b"b", reserved),) * 4,
    )
    known = ledger_segments._Placed(None, (("s", 5),), None)
    diff = ledger_segments._diff_of((old_parts, old_keys), encoded, known)
    assert diff is not None
    patches = ((0, 2), (2, 0))
    code = STATUS_CODE[reserved]
    expected = encode_packed_record(
        PackedRecordOut(
            base=base,
            header=msgspec.Raw(head) if header == "whole" else None,
            siblings=[
                (index, start, [msgspec.Raw(piece) for piece in pieces[index][start:]])
                for index, start in patches
            ],
            statuses=[(0, 0, code), (1, 1, code)],
            header_fields={1: msgspec.Raw(parts[1])} if header == "fields" else None,
        )
    )
    assert diff.record(base) == expected
    # Its size as planned (base (0, 5)) is within the bytes of the base's position.
    assert abs(diff.size - len(expected)) <= len(msgspec.msgpack.encode(base)) - 3
