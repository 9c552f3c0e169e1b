"""The ledger sidecar's index as runs (version 8, issue 16): a snapshot writes each live
group's record as part of a run of consecutive records, not as a pair per group; it
restores the same ledger as the pairs did (version 7, still read); a run outside its
segment, overlapping another or naming an unlisted segment is refused naming it; an
unknown version is refused naming the file and the version."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pipeline_helpers import small_config
from snapshot_versions import (
    advertise_sidecar,
    rewrite_sidecar,
    sidecar_as_version_7,
    sidecar_as_version_8,
    sidecar_as_version_9,
)
from test_group_entries import _reserve
from test_incremental_snapshots import SIBLINGS, Run

from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import read_snapshot_files
from rollvault.controller.snapshots.verification import VerificationLevel, verify_snapshot
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.indexed_sidecar import (
    LedgerIndex,
    LedgerRunsIndex,
    LedgerSegmentEntryV9,
    LedgerSegmentRef,
    LedgerSegmentRow,
    expand_runs,
    index_runs,
    ledger_segment_file_name,
)
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME


def _ref(name: str, records: int) -> LedgerSegmentRef:
    return LedgerSegmentRef(
        file=f"{name}.ledger-segment.msgpack", sha256="0" * 64, byte_size=1, record_count=records
    )


def test_runs_stand_for_exactly_the_pairs_they_were_made_of() -> None:
    segments = [_ref("a", 10), _ref("b", 5)]
    pairs = [(0, 0), (0, 1), (0, 2), (1, 4), (0, 3), (0, 5), (1, 0), (1, 1), (0, 9)]
    index = LedgerIndex(segments=segments, groups=pairs)
    runs = index_runs(index)
    assert runs.runs == [(0, 0, 3), (1, 4, 1), (0, 3, 1), (0, 5, 1), (1, 0, 2), (0, 9, 1)]
    assert expand_runs(runs) == index
    assert msgspec.json.encode(runs.segments[1]) == (
        b'["b.ledger-segment.msgpack","' + b"0" * 64 + b'",1,5]'
    )
    assert index_runs(LedgerIndex(segments=segments, groups=[])).runs == []


@pytest.mark.parametrize(
    ("runs", "problem"),
    [
        ([(0, 8, 3)], "$.ledger_index.runs[0]: records 8..10 of 'a.ledger-segment.msgpack'"),
        ([(0, 0, 1), (2, 0, 1)], "$.ledger_index.runs[1]: segment 2 of 2 listed"),
    ],
)
def test_a_run_outside_its_segment_or_the_listed_ones_is_refused(
    runs: list[tuple[int, int, int]], problem: str
) -> None:
    segments = [LedgerSegmentRow.of(_ref("a", 10)), LedgerSegmentRow.of(_ref("b", 5))]
    index = LedgerRunsIndex(segments=segments, runs=runs)
    with pytest.raises(LedgerStateError) as caught:
        expand_runs(index)
    assert problem in str(caught.value)


def _config(tmp_path: Path) -> RunConfig:
    return small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")


def _snapshot(config: RunConfig, groups: int) -> Path:
    async def write() -> Path:
        run = Run.fresh(config)
        for n in range(groups):
            await _reserve(run.parts, sealed=n % 3, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return newest

    return asyncio.run(write())


def _ledger(snapshot: Path) -> Any:
    loaded = read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))
    return loaded.recovery.ledger_state, loaded.ledger_chains


def _as_version_9(snapshot: Path) -> dict[str, Any]:
    """The snapshot's sidecar (version 10) as version 9, what main wrote before it."""
    written = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    return sidecar_as_version_9(written, snapshot)


def _problem(snapshot: Path) -> str:
    verification = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.path == snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    return problem.problem


def test_a_snapshot_writes_runs_and_restores_the_ledger_the_pairs_of_version_7_did(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    snapshot = _snapshot(config, groups=6)
    written = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    assert written["schema_version"] == 10 and "groups" not in written["ledger_index"]
    assert written["ledger_index"]["runs"] == [[0, 0, 6]]  # one segment, in ledger order
    ledger = _ledger(snapshot)
    assert len(ledger[0]["groups"]) == 6
    # Version 9 (each segment's row in the index, no catalog), what main wrote before
    # version 10, is still read, the same.
    state = sidecar_as_version_9(written, snapshot)
    rewrite_sidecar(snapshot, state)
    assert (
        json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())["schema_version"] == 9
    )
    assert _ledger(snapshot) == ledger
    # Version 8 (each segment named by its file, the digest in hex), what main wrote
    # before version 9, is still read, the same.
    rewrite_sidecar(snapshot, sidecar_as_version_8(state))
    written = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    assert written["schema_version"] == 8 and isinstance(
        written["ledger_index"]["segments"][0][0], str
    )
    assert _ledger(snapshot) == ledger
    # The writer before version 8 (version 7: a pair per group) is still read, the same.
    rewrite_sidecar(snapshot, sidecar_as_version_7(state))
    assert json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())["ledger_index"][
        "groups"
    ] == [[0, n] for n in range(6)]
    assert _ledger(snapshot) == ledger
    verification = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.FULL
    )
    assert verification.ok, verification.problems


def test_version_9_rows_name_this_writer_s_segments_by_number_and_read_back_the_same() -> None:
    files = [
        ledger_segment_file_name("000012"),  # the writer's: its number
        ledger_segment_file_name("000012-cold"),  # a cold segment: its name
        ledger_segment_file_name("12"),  # not zero-padded: its name
        ledger_segment_file_name("1234567"),  # past six digits: its number
    ]
    refs = [
        LedgerSegmentRef(file=file, sha256=f"{n:064x}", byte_size=100 + n, record_count=1 + n)
        for n, file in enumerate(files)
    ]
    rows = [LedgerSegmentEntryV9.of(ref) for ref in refs]
    assert [row.name for row in rows] == [12, files[1], files[2], 1234567]
    decoded = msgspec.json.decode(msgspec.json.encode(rows), type=list[LedgerSegmentEntryV9])
    assert [row.ref() for row in decoded] == refs
    # The common row, about half version 8's.
    compact = len(msgspec.json.encode(rows[0]))
    assert compact < 0.55 * len(msgspec.json.encode(LedgerSegmentRow.of(refs[0])))


def test_a_version_9_row_with_a_digest_of_the_wrong_length_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    snapshot = _snapshot(_config(tmp_path), groups=3)
    state = _as_version_9(snapshot)
    assert state["schema_version"] == 9
    state["ledger_index"]["segments"][0][1] = "AAAA"  # 3 bytes, base64
    rewrite_sidecar(snapshot, state)
    problem = _problem(snapshot)
    assert "$.ledger_index.segments[0][1]" in problem and "length" in problem


def test_a_version_9_row_naming_the_writer_s_segment_as_text_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """The writer names its own segments by number: the same file's name as text is refused
    (it would read the same file, but no writer of version 9 writes it), and retention,
    which reads the same rows, deletes nothing."""
    snapshot = _snapshot(_config(tmp_path), groups=3)
    state = _as_version_9(snapshot)
    number = state["ledger_index"]["segments"][0][0]
    assert isinstance(number, int)
    state["ledger_index"]["segments"][0][0] = ledger_segment_file_name(f"{number:06d}")
    rewrite_sidecar(snapshot, state)
    problem = _problem(snapshot)  # the problem's path is the sidecar file
    assert problem.endswith(
        f"[0] (name): the text {ledger_segment_file_name(f'{number:06d}')!r} where its "
        f"sequence number {number} is due - at `$.ledger_index.segments[0]`"
    )
    segments = sorted(p.name for p in (snapshot.parent / "segments").iterdir())
    assert collect_segments(snapshot.parent) is None
    assert sorted(p.name for p in (snapshot.parent / "segments").iterdir()) == segments


def test_overlapping_runs_reach_a_record_twice_and_are_refused(tmp_path: Path) -> None:
    snapshot = _snapshot(_config(tmp_path), groups=3)
    state = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    state["ledger_index"]["runs"] = [[0, 0, 2], [0, 1, 1]]  # three groups, record 1 twice
    rewrite_sidecar(snapshot, state)
    assert "$.ledger_index.groups[2]" in _problem(snapshot)


def test_a_run_past_its_segment_s_records_is_refused_naming_the_run(tmp_path: Path) -> None:
    snapshot = _snapshot(_config(tmp_path), groups=3)
    state = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    state["ledger_index"]["runs"] = [[0, 1, 3]]
    rewrite_sidecar(snapshot, state)
    assert "$.ledger_index.runs[0]: records 1..3 of " in _problem(snapshot)


def test_an_unknown_sidecar_version_is_refused_naming_it_and_retention_deletes_nothing(
    tmp_path: Path,
) -> None:
    snapshot = _snapshot(_config(tmp_path), groups=2)
    advertise_sidecar(snapshot, schema_version=11)
    problem = _problem(snapshot)
    assert "ledger schema 11" in problem and "reads schemas 3, 4, 5, 6, 7, 8, 9, 10" in problem
    state = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    state["schema_version"] = 11
    rewrite_sidecar(snapshot, state)
    segments = sorted(p.name for p in (snapshot.parent / "segments").iterdir())
    assert collect_segments(snapshot.parent) is None  # what it references is unknown
    assert sorted(p.name for p in (snapshot.parent / "segments").iterdir()) == segments
