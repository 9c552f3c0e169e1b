"""Child process of the fact-segment crash tests: snapshots whose group facts live in segments.

Run as ``python fact_segments_crash_child.py <mode> <checkpoint_dir>``; the
test starts it with ``ROLLVAULT_FAULT_KILL_AT``/``ROLLVAULT_FAULT_TRACE`` set
(see rollvault.durable.faults).

The facts at step ``s`` are two groups per step ``t`` in ``s - 1..s`` (dataset
indices ``2t`` and ``2t + 1``): each has its origin, and those of ``t < s``
are finalized and wait in the replay index (their replay entries, newest
first, so their order is not the facts'); so every step adds two origins,
finalizes two groups and drops the two oldest (their facts die, and segments
go sparse, are compacted and collected). A step restores the newest committed snapshot's facts (seeding
the fact writer, as a restarted run does), moves one step on, and publishes
a snapshot as the checkpointer does: the new facts into a fact segment, the
index as ``group_facts.json`` and the replay order as ``replay_order.json`` (the
step is the manifest's dispatch index), an
empty data plane (what segment retention reads), commit, retention (keep 2),
then segment collection.

With ``FACT_MERGE_BOUNDS_ENV`` set to ``"<due>,<max>"`` no segment counts as sparse
and the writer's bounds on referenced segments are those: every step then merges
segments by the budget (past ``due``) or by force (past ``max``) instead of compacting
sparse ones, so the kills land in merging snapshots.

Modes:
  commit   one step as above (the first one starts from step 0); prints what the fact
           writer did (facts written, compacted, segments forced, bytes merged by choice)
  verify   print a JSON report: every committed snapshot's facts read and checked
           against its step, the fact segments on disk and referenced
  recover  verify, commit one step, verify again; print both reports
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
from segment_crash_support import KEEP_LATEST_K, files_in, manifest_for

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.controller.snapshots import fact_writer
from rollvault.controller.snapshots.fact_forms import FACT_SEGMENT_SUFFIXES
from rollvault.controller.snapshots.fact_index import (
    FACT_CATALOG_SUFFIX,
    GROUP_FACTS_FILENAME,
    FactsError,
    encode_group_facts_file,
)
from rollvault.controller.snapshots.fact_segments import (
    LoadedFacts,
    read_group_facts,
    replay_in_order,
)
from rollvault.controller.snapshots.fact_writer import FactSeed, FactSegmentWriter
from rollvault.controller.snapshots.segment_retention import (
    collect_segments,
    referenced_group_fact_segments,
)
from rollvault.controller.snapshots.snapshot_files import DATA_PLANE_DIRNAME, segments_dir_for
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import EmbeddedDataPlane
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.errors import SnapshotError
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.ledger.reward_penalties import FinalizedReward


def finalization(idx: int) -> FinalizedGroup:
    return FinalizedGroup.of(
        rewards=[FinalizedReward(raw_reward=float(idx), reward=idx / 2, masked=False)],
        metrics={"reward_mean": idx / 2},
        gate_rollout_ids=[f"g{idx}_g0_a{idx:032x}"],
    )


FACT_MERGE_BOUNDS_ENV = "ROLLVAULT_TEST_FACT_MERGE_BOUNDS"


def _merge_bounds() -> None:
    """Apply ``FACT_MERGE_BOUNDS_ENV`` (see the module docstring) if it is set."""
    bounds = os.environ.get(FACT_MERGE_BOUNDS_ENV)
    if bounds is None:
        return
    due, most = (int(part) for part in bounds.split(","))
    fact_writer.COMPACT_BELOW = 0.0  # type: ignore[misc]
    fact_writer.DUE_REFERENCED = due  # type: ignore[misc]
    fact_writer.MAX_REFERENCED = most  # type: ignore[misc]


Facts = tuple[dict[str, GroupOrigin], dict[str, str], dict[str, FinalizedGroup], list[ReplayEntry]]
REPLAY_ORDER_FILENAME = "replay_order.json"


def expected(step: int) -> Facts:
    """The origins, prompt identities, finalizations and replay entries (in the replay
    index's order) a snapshot of ``step`` holds."""
    steps = range(max(1, step - 1), step + 1)
    indices = [idx for t in steps for idx in (2 * t, 2 * t + 1)]
    origins = {f"g{idx}": GroupOrigin(epoch=0, dataset_idx=idx) for idx in indices}
    identities = {f"g{idx}": f"{idx:064x}" for idx in indices}
    finalized = {f"g{idx}": finalization(idx) for idx in indices if idx // 2 < step}
    replay = [
        ReplayEntry(f"g{idx}", str(idx), 0, idx, idx + 1, idx // 2)
        for idx in reversed(indices)
        if idx // 2 < step
    ]
    return origins, identities, finalized, replay


def read(snapshot: Path) -> tuple[int, Facts, LoadedFacts]:
    """The snapshot's step, its facts (the replay entries in the order its runs give) and
    the loaded index, checked as restore checks them."""
    step = read_snapshot_manifest(snapshot).sampler_dispatch_index
    path = snapshot / GROUP_FACTS_FILENAME
    facts = read_group_facts(path, path.read_bytes(), segments_dir_for(snapshot))
    order_path = snapshot / REPLAY_ORDER_FILENAME
    runs = msgspec.json.decode(order_path.read_bytes(), type=list[tuple[int, int]])
    replay = replay_in_order(order_path, facts, runs)
    return step, (facts.origins, facts.prompt_identities, facts.finalized, replay), facts


def commit(checkpoint_dir: Path) -> None:
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    anchor.mkdir(parents=True, exist_ok=True)
    root = snapshots_root(anchor)
    committed = committed_snapshot_paths(root)
    writer = FactSegmentWriter(segments_dir_for(root / "snapshot_0"))
    step = 0
    if committed:
        step, _found, loaded = read(committed[-1])
        writer = FactSeed(writer.segments_dir, loaded).writer()
    step += 1
    origins, identities, finalized, replay = expected(step)
    rows = EmbeddedDataPlane(DataPlaneMutationCut()).capture()  # no rows: retention reads it

    def payload(tmp: Path) -> None:
        SegmentedWriter(writer.segments_dir).write(
            tmp / DATA_PLANE_DIRNAME, rows, {}, stem=tmp.name[13:]
        )
        pending = writer.write(origins, identities, finalized, stem=tmp.name[13:], replay=replay)
        index = encode_group_facts_file(pending.index, pending.catalogs)  # version 4
        (tmp / GROUP_FACTS_FILENAME).write_bytes(index)
        (tmp / REPLAY_ORDER_FILENAME).write_bytes(msgspec.json.encode(pending.replay_order))

    publish_snapshot(
        anchor, manifest=manifest_for(step), write_payload=payload, keep_latest_k=KEEP_LATEST_K
    )
    assert writer.last_written is not None
    info = writer.last_written.info
    writer.committed(writer.last_written)
    collect_segments(root, also_keep=writer.base_segments())
    done = {
        "written": info.new_facts,
        "compacted": info.compacted_facts,
        "forced": info.forced_segments,
        "merged_bytes": info.merged_bytes,
    }
    print(json.dumps(done))


def verify(checkpoint_dir: Path) -> dict[str, Any]:
    root = snapshots_root(checkpoint_dir / BOOTSTRAP_DIRNAME)
    problems: dict[str, str] = {}
    steps = []
    for path in committed_snapshot_paths(root):
        try:
            step, found, _loaded = read(path)
        except (FactsError, SnapshotError, OSError) as exc:
            problems[path.name] = str(exc)
            continue
        steps.append(step)
        if found != expected(step):
            problems[path.name] = f"step {step} holds {found}"
    segments_dir = segments_dir_for(root / "snapshot_0")
    on_disk = files_in(segments_dir)
    return {
        "steps": steps,
        "problems": problems,
        "segments": [
            name
            for name in on_disk
            if name.endswith(FACT_SEGMENT_SUFFIXES) or name.endswith(FACT_CATALOG_SUFFIX)
        ],
        "all_files": on_disk,
        "referenced": sorted(referenced_group_fact_segments(committed_snapshot_paths(root))),
    }


def main() -> None:
    mode, checkpoint_dir = sys.argv[1], Path(sys.argv[2])
    _merge_bounds()
    if mode == "commit":
        commit(checkpoint_dir)
    elif mode == "verify":
        print(json.dumps(verify(checkpoint_dir)))
    elif mode == "recover":
        before = verify(checkpoint_dir)
        with contextlib.redirect_stdout(io.StringIO()):  # one JSON report
            commit(checkpoint_dir)
        print(json.dumps({"before": before, "after": verify(checkpoint_dir)}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
