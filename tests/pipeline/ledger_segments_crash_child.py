"""Child process of the ledger-segment crash tests: snapshots whose ledger lives in segments.

Run as ``python ledger_segments_crash_child.py <mode> <checkpoint_dir>``; the
test starts it with ``ROLLVAULT_FAULT_KILL_AT``/``ROLLVAULT_FAULT_TRACE`` set
(see rollvault.durable.faults).

The ledger at step ``s`` holds two groups per step ``t`` in ``s - 1..s``
(prompts ``2t`` and ``2t + 1``): dispatched for ``t < s``, reserved for
``t == s``; so every step adds two groups, changes the two before, and drops
(fails, then gives up) the two before those. A step restores the
newest committed snapshot's ledger (seeding the ledger writer, as a restarted
run does), moves one step on, and publishes a snapshot exactly as the
checkpointer does: the changed records into a ledger segment, the version 6
sidecar (the step is its ``batch_shortfall``'s only key), commit, retention
(keep 2), then segment collection.

Modes:
  commit   one step as above (the first one starts from step 0)
  verify   print a JSON report: every committed snapshot read and checked group
           by group against its step, the ledger segments on disk and referenced
  recover  verify, commit one step, verify again; print both reports
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any

from segment_crash_support import KEEP_LATEST_K, files_in, manifest_for

from rollvault.controller.snapshots.ledger_segments import (
    LedgerSeed,
    LedgerSegmentWriter,
    catalog_listing,
)
from rollvault.controller.snapshots.segment_retention import (
    collect_segments,
    referenced_ledger_segments,
)
from rollvault.controller.snapshots.snapshot_files import (
    DATA_PLANE_DIRNAME,
    SnapshotCorruptError,
    read_ledger_catalog,
    read_ledger_segment,
    segments_dir_for,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import EmbeddedDataPlane
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.ledger.errors import LedgerError
from rollvault.ledger.indexed_sidecar import (
    LEDGER_CATALOG_SUFFIX,
    LedgerIndex,
    assemble_indexed_ledger,
    decode_catalog_sidecar,
    encode_catalog_sidecar,
)
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.ledger_records import LEDGER_SEGMENT_SUFFIX, RecordChain
from rollvault.ledger.sidecar import (
    ROLLOUT_RECOVERY_STATE_FILENAME,
    ParsedRolloutRecoveryState,
    build_sidecar_envelope,
)


def read(
    snapshot: Path,
) -> tuple[ParsedRolloutRecoveryState, LedgerIndex, list[RecordChain]]:
    """The snapshot's sidecar (version 10, as the snapshot layer writes it: its segments'
    rows in ledger catalogs) and its ledger segments, checked as restore checks them."""
    state = decode_catalog_sidecar(
        (snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes(),
        finalizer_metrics_by_group={},
        finalizer_rewards_by_group={},
        read_catalog=functools.partial(read_ledger_catalog, segments_dir_for(snapshot)),
    )
    records = {
        ref.file: read_ledger_segment(segments_dir_for(snapshot) / ref.file, ref)
        for ref in state.ledger_index.segments
    }
    parsed, chains = assemble_indexed_ledger(state, records)
    return parsed, state.ledger_index, chains


def step_of(parsed: ParsedRolloutRecoveryState) -> int:
    (step,) = parsed.batch_shortfall
    return step


async def commit(checkpoint_dir: Path) -> None:
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    anchor.mkdir(parents=True, exist_ok=True)
    root = snapshots_root(anchor)
    cut = DataPlaneMutationCut()
    ledger = RolloutRecoveryLedger()
    committed = committed_snapshot_paths(root)
    step = 0
    writer = LedgerSegmentWriter(segments_dir_for(root / "snapshot_0"))
    async with cut.mutation():
        if committed:
            parsed, index, chains = read(committed[-1])
            ledger.load_parsed_state(cut, parsed)
            shared = ledger.shared_groups()
            writer = LedgerSeed(writer.segments_dir, shared, index, chains).writer()
            step = step_of(parsed)
        step += 1
        for record in ledger.groups():
            if int(record.prompt_id) // 2 == step - 1:
                ledger.mark_group_dispatched(cut, record.group_id)
            elif int(record.prompt_id) // 2 == step - 2:
                for sibling in range(2):
                    ledger.mark_sibling_failed(
                        cut,
                        record.group_id,
                        generation_index=sibling,
                        gate_rollout_id=record.gate_rollout_id(sibling),
                        reason="infra: the step moved on",
                    )
                ledger.drop_group(cut, record.group_id)
        for idx in (2 * step, 2 * step + 1):
            ledger.reserve_group(
                cut,
                prompt_id=str(idx),
                prompt_payload={"idx": idx},
                expected_generations=2,
                target_step=0,
                start_weight_version=0,
            )
    async with cut.checkpoint():
        records = ledger.capture().shared_groups()
        rows = EmbeddedDataPlane(cut).capture()  # no rows: the index retention reads
    envelope = build_sidecar_envelope(batch_shortfall={step: 0}, sampler_stamps_target_steps=True)

    def payload(tmp: Path) -> None:
        SegmentedWriter(writer.segments_dir).write(
            tmp / DATA_PLANE_DIRNAME, rows, {}, stem=tmp.name[13:]
        )
        pending = writer.write(records, stem=tmp.name[13:])
        catalogs = [catalog_listing(pending.catalogs[file]) for file in sorted(pending.catalogs)]
        data = encode_catalog_sidecar(envelope, pending.index, catalogs)
        (tmp / ROLLOUT_RECOVERY_STATE_FILENAME).write_bytes(data)

    publish_snapshot(
        anchor, manifest=manifest_for(step), write_payload=payload, keep_latest_k=KEEP_LATEST_K
    )
    assert writer.last_written is not None
    writer.committed(writer.last_written)
    collect_segments(root, also_keep=writer.base_segments())


def expected(step: int) -> list[tuple[str, str]]:
    return [
        (str(idx), "dispatched" if t < step else "reserved")
        for t in range(max(1, step - 1), step + 1)
        for idx in (2 * t, 2 * t + 1)
    ]


def verify(checkpoint_dir: Path) -> dict[str, Any]:
    root = snapshots_root(checkpoint_dir / BOOTSTRAP_DIRNAME)
    problems: dict[str, str] = {}
    steps = []
    catalogs_listed = {}
    for path in committed_snapshot_paths(root):
        try:
            parsed, _index, _chains = read(path)
        except (SnapshotCorruptError, LedgerError, OSError) as exc:
            problems[path.name] = str(exc)
            continue
        sidecar = json.loads((path / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
        catalogs_listed[path.name] = len(sidecar["ledger_index"]["catalogs"])
        step = step_of(parsed)
        steps.append(step)
        found = [
            (group["prompt_id"], group["siblings"][0]["attempts"][-1]["status"])
            for group in parsed.ledger_state["groups"]
        ]
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
            if name.endswith(LEDGER_SEGMENT_SUFFIX) or name.endswith(LEDGER_CATALOG_SUFFIX)
        ],
        "catalogs_listed": catalogs_listed,
        "all_files": on_disk,
        "referenced": sorted(referenced_ledger_segments(committed_snapshot_paths(root))),
    }


def main() -> None:
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
