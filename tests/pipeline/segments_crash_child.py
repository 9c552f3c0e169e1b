"""Child process of the incremental-snapshot crash tests: snapshots whose rows live in segments.

Run as ``python segments_crash_child.py <mode> <checkpoint_dir>``; the test
starts it with ``ROLLVAULT_FAULT_KILL_AT``/``ROLLVAULT_FAULT_TRACE`` set (see
rollvault.durable.faults).

The store's rows at step ``s`` are a sliding window: keys ``r<i>`` for ``i`` in
``[4s - 8, 4s)``, each derived from ``i``, so every step seals 4 rows and
retires 4; each snapshot records its step in its user metadata. A step
restores the newest committed snapshot into a fresh store (seeding the
segment writer, as a restarted run does), moves one step on, and publishes a
snapshot exactly as the checkpointer does: new rows into a segment, the
index, commit, retention (keep 2), then segment collection.

Modes:
  commit   one step as above (the first one starts from step 0)
  verify   print a JSON report: every committed snapshot read and checked row
           by row against its step, the segments on disk and those referenced
  recover  verify, commit one step, verify again; print both reports
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from segment_crash_support import KEEP_LATEST_K, files_in, manifest_for

from rollvault.controller.snapshots.segment_retention import collect_segments
from rollvault.controller.snapshots.snapshot_files import DATA_PLANE_DIRNAME, segments_dir_for
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    STAGING_PARTITION,
    DataPlaneCheckpointError,
    EmbeddedDataPlane,
    Row,
    segment_catalog,
)
from rollvault.dataplane.segment_catalog import CATALOG_FILE_SUFFIX
from rollvault.dataplane.segmented import read_segmented
from rollvault.dataplane.segmented_index import read_segmented_content, referenced_segments
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.dataplane.segments import segment_files
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root

ROWS_PER_STEP = 4
MAX_CATALOGS_ENV = "ROLLVAULT_TEST_MAX_CATALOGS"
"""Set: the most catalogs an index lists (1: every step merges the older catalog's live
entries into its own)."""


def row(index: int) -> Row:
    rng = np.random.default_rng(index)
    return {
        "input_ids": rng.integers(0, 1000, 8 + index % 5, dtype=np.int64),
        "logprobs": rng.standard_normal(8 + index % 5).astype(np.float32),
        "reward": float(index),
    }


def window(step: int) -> range:
    return range(max(0, ROWS_PER_STEP * (step - 2)), ROWS_PER_STEP * step)


def root_of(checkpoint_dir: Path) -> Path:
    return snapshots_root(checkpoint_dir / BOOTSTRAP_DIRNAME)


async def commit(checkpoint_dir: Path) -> None:
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    anchor.mkdir(parents=True, exist_ok=True)
    root = snapshots_root(anchor)
    plane = EmbeddedDataPlane(DataPlaneMutationCut())
    committed = committed_snapshot_paths(root)
    step = 0
    writer = SegmentedWriter(segments_dir_for(root / "snapshot_0"))
    if committed:
        newest = committed[-1]
        loaded = read_segmented(newest / DATA_PLANE_DIRNAME, segments_dir_for(newest))
        await plane.load_verified(loaded.checkpoint, source=newest)
        writer.seed(plane.capture(), loaded)
        step = int(loaded.checkpoint.user_metadata["step"])
    step += 1
    await plane.put(STAGING_PARTITION, {f"r{i}": row(i) for i in window(step)})
    await plane.clear(
        STAGING_PARTITION, [f"r{i}" for i in window(step - 1) if i not in window(step)]
    )
    capture = plane.capture()

    def payload(tmp: Path) -> None:
        writer.write(tmp / DATA_PLANE_DIRNAME, capture, {"step": step}, stem=tmp.name[13:])

    publish_snapshot(
        anchor, manifest=manifest_for(step), write_payload=payload, keep_latest_k=KEEP_LATEST_K
    )
    assert writer.last_written is not None
    writer.committed(writer.last_written)
    collect_segments(root, also_keep=writer.base_segments())


def verify(checkpoint_dir: Path) -> dict[str, Any]:
    root = root_of(checkpoint_dir)
    problems: dict[str, str] = {}
    steps = []
    for path in committed_snapshot_paths(root):
        try:
            loaded = read_segmented(path / DATA_PLANE_DIRNAME, segments_dir_for(path)).checkpoint
        except DataPlaneCheckpointError as exc:
            problems[path.name] = str(exc)
            continue
        step = int(loaded.user_metadata["step"])
        steps.append(step)
        rows = loaded.partitions[STAGING_PARTITION]
        if sorted(rows) != sorted(f"r{i}" for i in window(step)):
            problems[path.name] = f"step {step} holds keys {sorted(rows)}"
            continue
        for i in window(step):
            expected = row(i)
            got = rows[f"r{i}"]
            same = all(
                np.array_equal(got[f], v) if isinstance(v, np.ndarray) else got[f] == v
                for f, v in expected.items()
            )
            if not same:
                problems[path.name] = f"row r{i} differs"
    segments_dir = segments_dir_for(root / "snapshot_0")
    referenced = referenced_segments(
        [p / DATA_PLANE_DIRNAME for p in committed_snapshot_paths(root)]
    )
    catalogs = []
    if segments_dir.is_dir():
        catalogs = [p.name for p in segments_dir.iterdir() if p.name.endswith(CATALOG_FILE_SUFFIX)]
    listed = {}
    for path in committed_snapshot_paths(root):
        if path.name not in problems:
            index = read_segmented_content(path / DATA_PLANE_DIRNAME, segments_dir)
            listed[path.name] = [len(catalog.segments) for catalog in index.catalogs]
    return {
        "steps": steps,
        "problems": problems,
        "catalog_entries": listed,
        "segments": sorted(segment_files(segments_dir) + catalogs),
        "all_files": files_in(segments_dir),
        "referenced": sorted(referenced),
    }


def main() -> None:
    most = os.environ.get(MAX_CATALOGS_ENV)
    if most is not None:
        segment_catalog.MAX_CATALOGS = int(most)  # type: ignore[misc]
    mode, checkpoint_dir = sys.argv[1], Path(sys.argv[2])
    if mode == "commit":
        asyncio.run(commit(checkpoint_dir))
    elif mode == "verify":
        print(json.dumps(verify(checkpoint_dir)))
    elif mode == "recover":
        before = verify(checkpoint_dir)
        asyncio.run(commit(checkpoint_dir))
        print(json.dumps({"before": before, "after": verify(checkpoint_dir)}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
