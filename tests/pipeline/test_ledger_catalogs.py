"""Ledger catalogs (sidecar version 10): each ledger segment's row written once per anchor.

The sidecar lists the catalogs it uses and each segment by name; the rows are in
the catalogs (:mod:`rollvault.ledger.indexed_sidecar`, written by
:mod:`rollvault.controller.snapshots.ledger_segments`). These tests check the form
written, that every snapshot reads back the ledger its version 9 form gives, the
bound on catalogs, retention, a restart from version 9, and the refusals, each
naming the catalog or the index field.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import small_config
from snapshot_versions import rewrite_sidecar, sidecar_as_version_9
from test_group_entries import _reserve
from test_incremental_snapshots import SIBLINGS, Run, verified_resume

from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots import ledger_segments
from rollvault.controller.snapshots.snapshot_files import read_snapshot_files, segments_dir_for
from rollvault.controller.snapshots.verification import VerificationLevel, verify_snapshot
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.snapshot_dirs import committed_snapshot_paths
from rollvault.ledger.indexed_sidecar import (
    CATALOG_SIDECAR_SCHEMA_VERSION,
    LEDGER_CATALOG_SUFFIX,
    LedgerSegmentRef,
    decode_ledger_catalog,
    encode_ledger_catalog,
    ledger_segment_file_name,
)
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME


def _config(tmp_path: Path) -> RunConfig:
    return small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")


def _sidecar(snapshot: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    return state


def _ledger(snapshot: Path) -> Any:
    loaded = read_snapshot_files(snapshot, read_snapshot_manifest(snapshot))
    return loaded.recovery.ledger_state, loaded.ledger_chains


def _catalog_files(snapshot: Path) -> set[str]:
    return {
        p.name
        for p in segments_dir_for(snapshot).iterdir()
        if p.name.endswith(LEDGER_CATALOG_SUFFIX)
    }


def _snapshots(config: RunConfig, rounds: int) -> list[tuple[Path, Any, dict[str, Any], set[str]]]:
    """``rounds`` snapshots of one run, each after a new group and a seal into an older
    one: per snapshot its path, its ledger as read back, its sidecar, and the ledger
    catalogs on disk right after it."""

    async def main() -> list[tuple[Path, Any, dict[str, Any], set[str]]]:
        run = Run.fresh(config)
        groups: list[str] = []
        taken = []
        for n in range(rounds):
            groups.append(await _reserve(run.parts, sealed=n % 2, gate=run.gate))
            snapshot = await run.snapshot()
            taken.append(
                (snapshot, _ledger(snapshot), _sidecar(snapshot), _catalog_files(snapshot))
            )
        run.parts.logs.close()
        return taken

    return asyncio.run(main())


def test_each_snapshot_writes_only_its_new_segments_rows_and_reads_back_as_version_9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_segments, "MAX_CATALOGS", 2)
    taken = _snapshots(_config(tmp_path), rounds=6)
    for number, (snapshot, ledger, sidecar, on_disk) in enumerate(taken, start=1):
        assert sidecar["schema_version"] == CATALOG_SIDECAR_SCHEMA_VERSION
        index = sidecar["ledger_index"]
        # The writer's segments by number only, and at most MAX_CATALOGS catalogs.
        assert all(isinstance(name, int) for name in index["segments"])
        assert 1 <= len(index["catalogs"]) <= 2
        # The catalog a snapshot writes is named after it: a catalog is never rewritten.
        assert index["catalogs"][-1][0] == number
        # Retention: the catalogs on disk are those the kept snapshots and the writer use.
        listed = {f"{name:06d}{LEDGER_CATALOG_SUFFIX}" for name, *_ in index["catalogs"]}
        assert listed <= on_disk
        if snapshot.exists():
            # The same ledger as the same index with each row inline (version 9, main's).
            assert _ledger(snapshot) == ledger
            rewrite_sidecar(snapshot, sidecar_as_version_9(sidecar, snapshot))
            assert _sidecar(snapshot)["schema_version"] == 9
            assert _ledger(snapshot) == ledger
    # More segments than catalogs are referenced by the end: rows were merged, not lost.
    last = taken[-1][2]["ledger_index"]
    assert len(last["segments"]) > len(last["catalogs"])
    # Retention left no catalog that no kept snapshot was written listing.
    kept = set(committed_snapshot_paths(taken[-1][0].parent))
    listed_by_kept = {
        f"{name:06d}{LEDGER_CATALOG_SUFFIX}"
        for path, _ledger, sidecar, _disk in taken
        if path in kept
        for name, *_ in sidecar["ledger_index"]["catalogs"]
    }
    assert taken[-1][3] <= listed_by_kept


def test_the_sidecar_stops_growing_by_a_row_a_segment() -> None:
    """A catalog row is version 9's row; the index names a segment in a few bytes."""
    refs = [
        LedgerSegmentRef(
            file=ledger_segment_file_name(f"{n:06d}"),
            sha256=hashlib.sha256(bytes([n])).hexdigest(),
            byte_size=30_000 + n,
            record_count=256,
        )
        for n in range(100)
    ]
    data = encode_ledger_catalog(refs)
    name = "000100-ledger.catalog.json"
    assert decode_ledger_catalog(data, file=name, entry_count=100) == refs
    assert len(json.dumps(list(range(100)))) < 0.1 * len(data)


def test_a_restart_from_version_9_writes_one_catalog_of_every_referenced_segment(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)

    async def main() -> tuple[Any, dict[str, Any], Path]:
        run = Run.fresh(config)
        for n in range(3):
            await _reserve(run.parts, sealed=n % 2, gate=run.gate)
            newest = await run.snapshot()
        run.parts.logs.close()
        rewrite_sidecar(newest, sidecar_as_version_9(_sidecar(newest), newest))
        ledger = _ledger(newest)
        restarted = await Run.restored(config, verified_resume(config, newest))
        await _reserve(restarted.parts, sealed=1, gate=restarted.gate)
        after = await restarted.snapshot()
        restarted.parts.logs.close()
        return ledger, _sidecar(after), after

    _before, sidecar, after = asyncio.run(main())
    index = sidecar["ledger_index"]
    assert sidecar["schema_version"] == CATALOG_SIDECAR_SCHEMA_VERSION
    ((name, _sha, _size, count),) = index["catalogs"]
    assert count == len(index["segments"]) > 1  # the older segments' rows too, once
    assert verify_snapshot(after, generations_per_group=SIBLINGS, level=VerificationLevel.FULL).ok


# -- refusals --------------------------------------------------------------------------


def _one_snapshot(tmp_path: Path) -> Path:
    (snapshot, _ledger, _sidecar, _disk), *_ = _snapshots(_config(tmp_path), rounds=1)
    return snapshot


def _problem(snapshot: Path) -> tuple[Path, str]:
    verification = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    return problem.path, problem.problem


def _recatalog(snapshot: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """Rewrite the snapshot's (only) catalog changed by ``change`` and record the new bytes
    in its sidecar, so only the content is wrong; the catalog's path."""
    sidecar = _sidecar(snapshot)
    entry = sidecar["ledger_index"]["catalogs"][0]
    path = segments_dir_for(snapshot) / f"{entry[0]:06d}{LEDGER_CATALOG_SUFFIX}"
    content = json.loads(path.read_bytes())
    change(content)
    data = json.dumps(content).encode()
    path.write_bytes(data)
    entry[1] = base64.b64encode(hashlib.sha256(data).digest()).decode()
    entry[2] = len(data)
    entry[3] = len(content["entries"]) if isinstance(content.get("entries"), list) else entry[3]
    rewrite_sidecar(snapshot, sidecar)
    return path


def test_a_missing_or_changed_catalog_is_refused_naming_it(tmp_path: Path) -> None:
    snapshot = _one_snapshot(tmp_path)
    (catalog,) = (segments_dir_for(snapshot) / name for name in _catalog_files(snapshot))
    # Each verification reads the catalog again, though the sidecar naming it is unchanged
    # (the parse kept for the restore is never verification's answer).
    clean = verify_snapshot(
        snapshot, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    assert not clean.problems
    data = catalog.read_bytes()
    catalog.write_bytes(data[:-1] + b" ")  # the same size, another digest
    path, problem = _problem(snapshot)
    assert (
        path == catalog
        and "does not match" in problem
        and ROLLOUT_RECOVERY_STATE_FILENAME in problem
    )
    catalog.unlink()
    path, problem = _problem(snapshot)
    assert path == catalog and "missing ledger catalog" in problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c.update(schema_version=2), "$.schema_version: 2; this build reads catalog"),
        (lambda c: c.update(extra=1), "unknown field `extra`"),
        (lambda c: c["entries"][0].__setitem__(1, "AAAA"), "$.entries[0][1]"),
        (lambda c: c["entries"][0].__setitem__(3, 0), "$.entries[0][3]"),
        (lambda c: c["entries"].append(c["entries"][0]), "described twice (first at entries[0])"),
        (
            lambda c: c["entries"][0].__setitem__(
                0, f"{c['entries'][0][0]:06d}-ledger.ledger-segment.msgpack"
            ),
            "where its sequence number",
        ),
    ],
)
def test_a_catalog_whose_content_is_wrong_is_refused_naming_the_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    snapshot = _one_snapshot(tmp_path)
    catalog = _recatalog(snapshot, change)
    path, problem = _problem(snapshot)
    assert path == snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    assert f"ledger catalog {catalog.name}" in problem and expected in problem, problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda i: i["catalogs"][0].__setitem__(3, i["catalogs"][0][3] + 1),
            "holds 1 entries, the sidecar records 2",
        ),
        (lambda i: i["catalogs"].append(i["catalogs"][0]), "$.ledger_index.catalogs[1]: catalog"),
        (lambda i: i["segments"].append(99), "$.ledger_index.segments[1]: segment '000099-ledger"),
        (lambda i: i["segments"].append(i["segments"][0]), "$.ledger_index.segments[1]: segment"),
        (
            lambda i: i["segments"].__setitem__(
                0, ledger_segment_file_name(f"{i['segments'][0]:06d}")
            ),
            "$.ledger_index.segments[0]: [0] (name): the text",
        ),
        (lambda i: i["catalogs"].clear(), "$.ledger_index.segments[0]: segment"),
    ],
)
def test_an_index_that_does_not_match_its_catalogs_is_refused_naming_the_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    snapshot = _one_snapshot(tmp_path)
    sidecar = _sidecar(snapshot)
    change(sidecar["ledger_index"])
    rewrite_sidecar(snapshot, sidecar)
    path, problem = _problem(snapshot)
    assert path == snapshot / ROLLOUT_RECOVERY_STATE_FILENAME
    assert expected in problem, problem
