"""Benchmark of a rollout snapshot at 1,024 in-flight groups x 16 siblings (issue 5).

It builds a run's parts with ``build_parts`` and fills them through the real
components, every change inside ``cut.mutation()``:

- ``--groups`` (1,024) groups in flight, admitted by the in-order sampler,
  reserved and dispatched in the ledger, in a fixed mix of states: 25% with no
  sibling sealed yet, 40% partly sealed (1..15 siblings), 10% partly sealed
  with one failed sibling whose retry is minted, 25% fully sealed (waiting
  for the finalizer). Sealed siblings were run on the simulated gate, so their
  token rows are staged in the data plane;
- ``--canonical`` (96) more groups sealed and published by the ``Finalizer``
  into the replay index, a third of which then count as trained since the
  last trainer checkpoint (their rows are kept for a rollback).

It then measures:

- the cut hold: ``take_cut_capture`` inside ``cut.checkpoint()``, as the
  checkpointer does, ``--repeat`` times (p50, p99, max);
- the write: ``publish_snapshot`` (``write_snapshot_payload`` in the tmp dir,
  the manifest, fsync of every file and directory, atomic rename, retention),
  ``--writes`` times (median) and the bytes written;
- the restore: ``prepare_checkpoint_dir`` (resolve, read and verify the
  newest snapshot) and ``RolloutRestorer.restore`` into fresh parts,
  ``--restores`` times (median).

``--profile`` prints where the cut hold goes (cProfile, by cumulative time).

``--incremental N`` (issue 16) then runs N rounds of a steady state, each
followed by a snapshot as the checkpointer takes it (one segment writer for
the anchor, retention, segment collection): per round ``--seal-per-round``
(256) dispatched siblings are sealed and ``--finalize-per-round`` (8) fully
sealed groups are finalized (their staged rows cleared, canonical rows put)
and replaced by as many new groups. It reports, per snapshot, the bytes
written by file kind against the bytes of the rows new since the last
snapshot (goal: data-plane bytes <= 1.1x), and the restore of the last one.
The ledger goes to ledger segments (sidecar version 6: only changed groups'
records are written); ``--ledger-inline`` writes it as the writer before them
did (version 5: every group in the sidecar, every snapshot), for a side by side.
The per-group facts (origins, prompt identities, finalizations) go to fact
segments, each written once per anchor (``group_facts.json`` indexes them);
every file a snapshot writes is counted, by name.

Usage: python benchmarks/bench_snapshot_cut.py [--groups 1024] [--siblings 16]
       [--canonical 96] [--repeat 100] [--writes 5] [--restores 3] [--profile] [--json]
       [--incremental 10] [--seal-per-round 256] [--finalize-per-round 8] [--ledger-inline]
The files go to .bench_tmp/snapshot_cut/ in the checkout (not /tmp, which
may be tmpfs where fsync costs nothing) and are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.finalizer import Finalizer, capture_reward_settings
from rollvault.controller.loop.gate import AttemptRequest
from rollvault.controller.loop.parts import GroupOrigin, RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots.checkpointer import (
    build_snapshot,
    take_cut_capture,
)
from rollvault.controller.snapshots.fact_index import GROUP_FACTS_FILENAME
from rollvault.controller.snapshots.fact_writer import FactSegmentWriter
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir, run_fingerprint
from rollvault.controller.snapshots.segment_retention import (
    collect_segments,
    referenced_group_fact_segments,
    referenced_ledger_segments,
)
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    DATA_PLANE_DIRNAME,
    REPLAY_BUFFER_METADATA_FILENAME,
    RolloutStateCapture,
    segments_dir_for,
    write_snapshot_payload,
)
from rollvault.dataplane.checkpoint_format import METADATA_FILENAME
from rollvault.dataplane.checkpoint_io import read_checkpoint, write_checkpoint
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION
from rollvault.dataplane.segmented import read_segmented
from rollvault.dataplane.segmented_index import referenced_segments
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, SEGMENTS_DIRNAME
from rollvault.durable.publish import publish_snapshot
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME, build_rollout_recovery_state
from rollvault.ledger.state_convert import ledger_to_state
from rollvault.ledger.state_schema import ROLLOUT_RECOVERY_SCHEMA_VERSION
from rollvault.ledger.statuses import PromptGroupStatus, RolloutAttemptStatus
from rollvault.tasks.protocols import PromptDataset
from rollvault.tasks.registry import build_dataset
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "snapshot_cut"
PROMPTS_PER_STEP = 512


def _dataset(config: RunConfig) -> PromptDataset:
    """The run's dataset, as the recipe builds it for the simulated gate."""
    return build_dataset(
        config.dataset, vocab_size=config.gate.simulated.vocab_size, seed=config.seed
    )


def bench_config(root: Path, args: argparse.Namespace) -> RunConfig:
    total = args.groups + args.canonical
    replaced = args.incremental * args.finalize_per_round
    return load_run_config(
        None,
        [
            f"dataset.num_prompts={total + replaced}",
            f"grpo.num_generations_per_prompt={args.siblings}",
            f"grpo.num_prompts_per_step={PROMPTS_PER_STEP}",
            f"sampler.max_lookahead_versions={-(-total // PROMPTS_PER_STEP)}",
            f"rollout.max_inflight_prompts={args.groups}",
            f"rollout.max_buffered_rollouts={2 * (total + replaced)}",
            f"logging.log_dir={root / 'logs'}",
            f"checkpointing.checkpoint_dir={root / 'checkpoints'}",
            "logging.progress=false",
            *getattr(args, "set", []),
        ],
    )


# -- filling the parts ---------------------------------------------------------------


def sealed_count(index: int, siblings: int) -> tuple[int, bool]:
    """(siblings sealed, one more failed and retried) of in-flight group ``index``."""
    kind = index % 20
    if kind < 5:
        return 0, False
    if kind < 13:
        return 1 + index % (siblings - 1), False
    if kind < 15:
        return 1 + index % (siblings - 2), True
    return siblings, False


class Filler:
    """Drives the ledger, the gate and the finalizer like the rollout pump does."""

    def __init__(self, parts: RolloutParts) -> None:
        self.parts = parts
        self.gate = SimulatedGate(
            parts.config.gate.simulated, parts.data_plane, ParityEnvironment(), seed=0
        )
        self.finalizer = Finalizer(parts, end_weight_version={})

    async def group(self, sealed: int, failed: bool) -> str:
        parts = self.parts
        async with parts.cut.mutation():
            epoch, idx = parts.dataloader.next_index()
            target = parts.sampler.admit(epoch=epoch, trainer_version=0)
            record = parts.ledger.reserve_group(
                parts.cut,
                prompt_id=str(idx),
                prompt_payload=parts.dataset[idx],
                expected_generations=parts.config.grpo.num_generations_per_prompt,
                target_step=target,
                start_weight_version=0,
            )
            parts.add_reserved_group(record.group_id, GroupOrigin(epoch=epoch, dataset_idx=idx))
            parts.ledger.mark_group_dispatched(parts.cut, record.group_id)
        for index in range(sealed):
            await self.seal(record.group_id, index)
        if failed:
            await self.fail_and_retry(record.group_id, sealed)
        return record.group_id

    def request(self, group_id: str, index: int) -> AttemptRequest:
        record = self.parts.ledger.get_group(group_id)
        return AttemptRequest(
            group_id=group_id,
            generation_index=index,
            gate_rollout_id=record.gate_rollout_id(index),
            prompt=dict(record.prompt_payload),
            weight_version=0,
        )

    async def seal(self, group_id: str, index: int) -> None:
        parts = self.parts
        request = self.request(group_id, index)
        outcome = await self.gate.run_attempt(request)
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

    async def fail_and_retry(self, group_id: str, index: int) -> None:
        parts = self.parts
        async with parts.cut.mutation():
            parts.ledger.mark_sibling_failed(
                parts.cut,
                group_id,
                generation_index=index,
                gate_rollout_id=self.request(group_id, index).gate_rollout_id,
                reason="infra: simulated worker loss",
            )
            parts.ledger.prepare_incomplete_retry(parts.cut, group_id)


async def fill(parts: RolloutParts, args: argparse.Namespace) -> None:
    filler = Filler(parts)
    for _ in range(args.canonical):
        await filler.finalizer.finalize(await filler.group(args.siblings, False))
    async with parts.cut.mutation():
        # Trained since the last trainer checkpoint: out of the index, rows kept.
        for entry in list(parts.replay)[: args.canonical // 3]:
            parts.replay.remove(entry.group_id)
            parts.trained_since_checkpoint.append(entry)
    for index in range(args.groups):
        await filler.group(*sealed_count(index, args.siblings))


def describe(parts: RolloutParts) -> dict[str, int]:
    records = parts.ledger.groups()
    return {
        "ledger_groups": len(records),
        "siblings": sum(len(r.siblings) for r in records),
        "attempts": sum(len(s.attempts) for r in records for s in r.siblings),
        "replay_groups": len(parts.replay),
        "trained_since_checkpoint": len(parts.trained_since_checkpoint),
        "staged_rows": len(parts.data_plane.keys(STAGING_PARTITION)),
        "train_rows": len(parts.data_plane.keys(TRAIN_PARTITION)),
    }


# -- measuring -----------------------------------------------------------------------


async def timed_capture(parts: RolloutParts, fingerprint: str) -> tuple[float, RolloutStateCapture]:
    """As the checkpointer does: only take_cut_capture holds the cut; the build follows."""
    async with parts.cut.checkpoint():
        started = time.perf_counter()
        cut = take_cut_capture(parts)
        held = time.perf_counter() - started
    return held, build_snapshot(cut, parts, fingerprint=fingerprint)


async def measure_cut(parts: RolloutParts, fingerprint: str, repeat: int) -> list[float]:
    holds = []
    for _ in range(repeat):
        seconds, _capture = await timed_capture(parts, fingerprint)
        holds.append(seconds)
    return holds


def write_once(anchor: Path, capture: RolloutStateCapture) -> tuple[float, int]:
    written: list[int] = []

    def payload(directory: Path) -> None:
        written.append(write_snapshot_payload(capture, directory))

    started = time.perf_counter()
    publish_snapshot(anchor, manifest=capture.manifest, write_payload=payload, keep_latest_k=2)
    return time.perf_counter() - started, written[0]


async def measure_writes(
    parts: RolloutParts, fingerprint: str, anchor: Path, writes: int
) -> tuple[list[float], int]:
    seconds = []
    size = 0
    for _ in range(writes):
        _hold, capture = await timed_capture(parts, fingerprint)
        elapsed, size = write_once(anchor, capture)
        seconds.append(elapsed)
    return seconds, size


async def restore_once(config: RunConfig, args: argparse.Namespace) -> dict[str, float]:
    started, started_cpu = time.perf_counter(), time.process_time()
    source = prepare_checkpoint_dir(config)
    resolved, resolved_cpu = time.perf_counter(), time.process_time()
    if source is None or source.snapshot is None:
        raise RuntimeError("the benchmark's snapshot was not found for restore")
    # A run collects once between choosing its snapshot and restoring it (the pipeline's
    # _long_lived_objects_frozen, before it freezes what exists): timed on its own.
    gc.collect()
    collected, collected_cpu = time.perf_counter(), time.process_time()
    parts = build_parts(config, dataset=_dataset(config))
    restorer = RolloutRestorer(
        parts,
        trainer=RecordingTrainer(),
        buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
        resume=source,
    )
    await restorer.restore()
    finished, finished_cpu = time.perf_counter(), time.process_time()
    parts.logs.close()
    if parts.seal_journal is not None:  # else each restore left its writer thread running
        await parts.seal_journal.aclose()
    restored = len(parts.ledger) + len(parts.replay)
    expected = args.groups + args.canonical
    if restored != expected:
        raise RuntimeError(f"restored {restored} groups, expected {expected}")
    raw_seconds, raw_bytes = raw_read(source.snapshot.path)
    # As a run's end does: what the reads and the restore froze is handed back, so each
    # restore of the benchmark starts as a fresh process's would.
    gc.unfreeze()
    gc.collect()
    return {
        "read_verify": resolved - started,
        "run_start_collect": collected - resolved,
        "restore": finished - collected,
        "read_verify_cpu": resolved_cpu - started_cpu,
        "restore_cpu": finished_cpu - collected_cpu,
        "total": (resolved - started) + (finished - collected),
        "raw_read": raw_seconds,
        "raw_bytes": raw_bytes,
    }


def raw_read(snapshot: Path) -> tuple[float, int]:
    """Seconds to read every byte of the snapshot's files and of the segments it references
    (what a restore reads), the floor a restore is held to.

    Run right after the restore read the same files, so both find them in the
    page cache alike.
    """
    segments = segments_dir_for(snapshot)
    referenced = referenced_segments([snapshot / DATA_PLANE_DIRNAME])
    referenced |= referenced_ledger_segments([snapshot])
    referenced |= referenced_group_fact_segments([snapshot])
    files = sorted(path for path in snapshot.rglob("*") if path.is_file())
    files += sorted(segments / name for name in referenced)  # read by a restore as well
    started = time.perf_counter()
    size = sum(len(path.read_bytes()) for path in files)
    return time.perf_counter() - started, size


# -- incremental snapshots (issue 16) ---------------------------------------------------


async def steady_round(filler: Filler, args: argparse.Namespace) -> None:
    """Seal dispatched siblings, finalize fully sealed groups and replace them."""
    parts = filler.parts
    sealed = 0
    for record in parts.ledger.groups():
        # A restore turns every interrupted attempt into a fresh, reserved one.
        current = [sibling.current_attempt.status for sibling in record.siblings]
        if RolloutAttemptStatus.RESERVED in current and sealed < args.seal_per_round:
            async with parts.cut.mutation():
                parts.ledger.mark_group_dispatched(parts.cut, record.group_id)
            record = parts.ledger.get_group(record.group_id)
        for sibling in record.siblings:
            if sealed == args.seal_per_round:
                break
            if sibling.current_attempt.status is RolloutAttemptStatus.DISPATCHED:
                await filler.seal(record.group_id, sibling.generation_index)
                sealed += 1
                break  # one sibling per group, spread over the groups
    done = [
        record.group_id
        for record in parts.ledger.groups()
        if record.status is PromptGroupStatus.READY_TO_FINALIZE
    ]
    for group_id in done[: args.finalize_per_round]:
        await filler.finalizer.finalize(group_id)
        await filler.group(0, False)


def file_bytes(snapshot: Path) -> dict[str, int]:
    """The snapshot directory's own files by kind: ledger sidecar, index, other sidecars
    (and of those, the controller state, the replay metadata and the group facts' index)."""

    def size(name: str) -> int:
        path = snapshot / name
        return path.stat().st_size if path.exists() else 0

    ledger = size(ROLLOUT_RECOVERY_STATE_FILENAME)
    index = (snapshot / DATA_PLANE_DIRNAME / METADATA_FILENAME).stat().st_size
    total = sum(path.stat().st_size for path in snapshot.rglob("*") if path.is_file())
    return {
        "ledger_sidecar": ledger,
        "index": index,
        "other_files": total - ledger - index,
        "controller_state": size(CONTROLLER_STATE_FILENAME),
        "replay_metadata": size(REPLAY_BUFFER_METADATA_FILENAME),
        "group_facts_index": size(GROUP_FACTS_FILENAME),
    }


async def measure_incremental(
    parts: RolloutParts, fingerprint: str, anchor: Path, args: argparse.Namespace
) -> list[dict[str, float]]:
    filler = Filler(parts)
    root = snapshots_root(anchor)
    writer = SegmentedWriter(root / SEGMENTS_DIRNAME)
    ledger = LedgerSegmentWriter(root / SEGMENTS_DIRNAME)
    facts = FactSegmentWriter(root / SEGMENTS_DIRNAME)
    rounds = []
    for index in range(args.incremental + 1):
        if index:
            await steady_round(filler, args)
        started = time.perf_counter()
        hold, capture = await timed_capture(parts, fingerprint)
        if args.ledger_inline:
            capture = inline_ledger(capture)
        build_seconds = time.perf_counter() - started - hold

        def payload(directory: Path, capture: RolloutStateCapture = capture) -> None:
            write_snapshot_payload(capture, directory, segments=writer, ledger=ledger, facts=facts)

        started = time.perf_counter()
        path = publish_snapshot(
            anchor, manifest=capture.manifest, write_payload=payload, keep_latest_k=2
        )
        pending = writer.last_written
        assert pending is not None
        writer.committed(pending)
        ledger_pending = ledger.last_written
        if ledger_pending is not None:
            ledger.committed(ledger_pending)
        facts_pending = facts.last_written
        assert facts_pending is not None
        facts.committed(facts_pending)
        collect_segments(
            root,
            also_keep=writer.base_segments() | ledger.base_segments() | facts.base_segments(),
        )
        seconds = time.perf_counter() - started
        sizes = file_bytes(path)
        info = pending.info
        ledger_bytes = (
            0
            if ledger_pending is None
            # the ledger catalog (sidecar version 10; 0 before it) counts with its segments
            else ledger_pending.info.segment_bytes
            + getattr(ledger_pending.info, "catalog_bytes", 0)
        )
        rounds.append(
            {
                "build_ms": 1e3 * build_seconds,
                "write_ms": 1e3 * seconds,
                "ledger_segment_bytes": ledger_bytes,
                "ledger_catalog_bytes": (
                    0
                    if ledger_pending is None
                    else getattr(ledger_pending.info, "catalog_bytes", 0)
                ),
                "ledger_records_written": (
                    len(capture.recovery_state["ledger"]["groups"])
                    if ledger_pending is None
                    else ledger_pending.info.new_records
                ),
                "ledger_records_compacted": (
                    0 if ledger_pending is None else ledger_pending.info.compacted_records
                ),
                "ledger_delta_records": (
                    0
                    if ledger_pending is None
                    else getattr(ledger_pending.info, "delta_records", 0)
                ),
                # the rewrite budget's figures (0 for a writer without one)
                **{
                    f"ledger_{name}": (
                        0 if ledger_pending is None else getattr(ledger_pending.info, name, 0)
                    )
                    for name in ("budget", "rewritten_bytes", "forced_records", "queued_records")
                },
                "new_rows": info.new_rows,
                "new_row_bytes": info.new_row_bytes,
                "segment_bytes": info.segment_bytes,
                **sizes,
                "fact_segment_bytes": facts_pending.info.segment_bytes,
                # the fact catalog (group_facts.json version 4; 0 before it)
                "fact_catalog_bytes": getattr(facts_pending.info, "catalog_bytes", 0),
                "facts_written": facts_pending.info.new_facts,
                "facts_compacted": facts_pending.info.compacted_facts,
                "fact_segments_referenced": len(facts_pending.info.referenced),
                # the row segments' catalog (data-plane index version 4; 0 before it)
                "catalog_bytes": getattr(info, "catalog_bytes", 0),
                "data_plane_bytes": info.segment_bytes
                + getattr(info, "catalog_bytes", 0)
                + sizes["index"],
                "total_bytes": info.segment_bytes
                + getattr(info, "catalog_bytes", 0)
                + ledger_bytes
                + facts_pending.info.segment_bytes
                + getattr(facts_pending.info, "catalog_bytes", 0)
                + sizes["ledger_sidecar"]
                + sizes["index"]
                + sizes["other_files"],
                "segments_referenced": len(info.referenced),
                "segments_on_disk_bytes": sum(
                    p.stat().st_size for p in (root / SEGMENTS_DIRNAME).iterdir()
                ),
            }
        )
    return rounds


def inline_ledger(capture: RolloutStateCapture) -> RolloutStateCapture:
    """The capture as the writer before ledger segments wrote it: every group in the sidecar."""
    assert capture.ledger_records is not None
    state = dict(
        capture.recovery_state,
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        ledger=msgspec.to_builtins(ledger_to_state(capture.ledger_records)),
    )
    return dataclasses.replace(capture, recovery_state=state, ledger_records=None)


def compare_formats(parts: RolloutParts, newest: Path, scratch: Path) -> dict[str, float]:
    """The newest snapshot's rows read from its segments vs the same rows rewritten whole
    in the version 1 format (every row in the snapshot's own files), alternately, 3 times."""
    write_checkpoint(scratch, parts.data_plane.capture(), {})
    whole_bytes = sum(path.stat().st_size for path in scratch.iterdir())
    times: dict[str, list[float]] = {"whole": [], "segments": []}
    for _ in range(3):
        started = time.perf_counter()
        read_checkpoint(scratch)
        times["whole"].append(time.perf_counter() - started)
        started = time.perf_counter()
        read_segmented(newest / DATA_PLANE_DIRNAME, segments_dir_for(newest))
        times["segments"].append(time.perf_counter() - started)
    shutil.rmtree(scratch)
    return {
        "whole_bytes": whole_bytes,
        "whole_read_ms": 1e3 * statistics.median(times["whole"]),
        "segments_read_ms": 1e3 * statistics.median(times["segments"]),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    config = bench_config(root, args)
    if prepare_checkpoint_dir(config) is not None:
        raise RuntimeError(f"{root} already holds a run")
    fingerprint = run_fingerprint(config)
    parts = build_parts(config, dataset=_dataset(config))
    started = time.perf_counter()
    await fill(parts, args)
    fill_seconds = time.perf_counter() - started
    shape = describe(parts)
    holds = await measure_cut(parts, fingerprint, args.repeat)
    anchor = Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME
    writes, size = await measure_writes(parts, fingerprint, anchor, args.writes)
    parts.logs.close()
    restores = [await restore_once(config, args) for _ in range(args.restores)]
    result: dict[str, Any] = {
        "shape": shape,
        "fill_seconds": fill_seconds,
        "cut_hold_ms": {
            "p50": 1e3 * percentile(holds, 0.5),
            "p99": 1e3 * percentile(holds, 0.99),
            "max": 1e3 * max(holds),
            "n": len(holds),
        },
        "write_ms_median": 1e3 * statistics.median(writes),
        "snapshot_bytes": size,
        "restore_ms_median": {
            key: 1e3 * statistics.median(r[key] for r in restores)
            for key in restores[0]
            if key != "raw_bytes"
        },
        "restore_raw_bytes": restores[0]["raw_bytes"],
    }
    if args.profile:
        result["profile"] = await profiles(parts, config, fingerprint, args)
    if args.incremental:
        parts = build_parts(config, dataset=_dataset(config))
        restorer = RolloutRestorer(
            parts,
            trainer=RecordingTrainer(),
            buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
            resume=prepare_checkpoint_dir(config),  # type: ignore[arg-type]
        )
        await restorer.restore()
        result["incremental"] = await measure_incremental(parts, fingerprint, anchor, args)
        newest = committed_snapshot_paths(snapshots_root(anchor))[-1]
        result["formats"] = compare_formats(parts, newest, root / "v1_compare")
        parts.logs.close()
        args.groups = len(parts.ledger)  # what the last snapshot holds, for the check
        args.canonical = len(parts.replay)
        restores = [await restore_once(config, args) for _ in range(args.restores)]
        result["incremental_restore_ms_median"] = {
            key: 1e3 * statistics.median(r[key] for r in restores) for key in restores[0]
        }
    return result


def hold_breakdown(parts: RolloutParts, repeat: int) -> dict[str, float]:
    """Median ms of each piece of a snapshot's capture, timed one by one."""
    entries = tuple(parts.trained_since_checkpoint) + parts.replay.state_dict().entries
    canonical = {entry.group_id for entry in entries}

    def without_gc() -> object:
        gc.disable()
        try:
            return take_cut_capture(parts)
        finally:
            gc.enable()

    pieces: dict[str, Callable[[], object]] = {
        "take_cut_capture (the whole cut hold)": lambda: take_cut_capture(parts),
        "take_cut_capture, cyclic GC disabled": without_gc,
        "  of which ledger.capture() (copy-on-write view)": parts.ledger.capture,
        "take_cut_capture + build_snapshot (the build runs after the cut)": lambda: build_snapshot(
            take_cut_capture(parts), parts, fingerprint=None
        ),
        "build_rollout_recovery_state (ledger sidecar as builtins)": lambda: (
            build_rollout_recovery_state(
                parts.ledger,
                batch_shortfall=parts.shortfall.as_dict(),
                sampler_stamps_target_steps=parts.sampler.stamps_target_steps,
                finalizer_metrics_by_group={
                    g: parts.group(g).finalization().metrics_dict() for g in canonical
                },
                finalizer_rewards_by_group={
                    g: list(parts.group(g).finalization().rewards) for g in canonical
                },
                reward_settings=capture_reward_settings(parts.config.reward),
                canonical_group_ids=canonical,
            )
        ),
        "  of which ledger.state_dict() (records -> Structs -> builtins)": (
            parts.ledger.state_dict
        ),
        "prompt identities (dataset.identity per group, SHA-256)": lambda: [
            parts.dataset.identity(entry.origin.dataset_idx) for entry in parts.groups.values()
        ],
        "data_plane.capture() (reference copy per row)": parts.data_plane.capture,
        "replay, sampler, dataloader, spares state_dict": lambda: (
            parts.replay.state_dict(),
            parts.sampler.state_dict(),
            parts.dataloader.state_dict(),
            parts.spares.state_dict(),
        ),
    }
    result = {}
    for name, piece in pieces.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            piece()
            times.append(time.perf_counter() - started)
        result[name] = 1e3 * statistics.median(times)
    return result


def profiled(call: Callable[[], object], top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


async def profiles(
    parts: RolloutParts, config: RunConfig, fingerprint: str, args: argparse.Namespace
) -> dict[str, Any]:
    _hold, capture = await timed_capture(parts, fingerprint)
    anchor = Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME
    loop = asyncio.get_running_loop()

    def restore() -> None:
        # A nested loop in a worker thread: restore is async, the profiler is not.
        asyncio.run(restore_once(config, args))

    return {
        "breakdown_ms": hold_breakdown(parts, 10),
        "capture": profiled(
            lambda: build_snapshot(take_cut_capture(parts), parts, fingerprint=fingerprint),
            args.profile_top,
        ),
        "write": profiled(lambda: write_once(anchor, capture), args.profile_top),
        "restore": await loop.run_in_executor(None, profiled, restore, args.profile_top),
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    shape = result["shape"]
    hold = result["cut_hold_ms"]
    restore = result["restore_ms_median"]
    lines = [
        f"snapshot of {shape['ledger_groups']} in-flight groups x {args.siblings} siblings "
        f"({shape['attempts']} attempts, {shape['staged_rows']} staged rows) + "
        f"{shape['replay_groups']} replay groups + {shape['trained_since_checkpoint']} trained "
        f"since the trainer checkpoint ({shape['train_rows']} train rows)",
        f"  cut hold (take_cut_capture in cut.checkpoint(), n={hold['n']}): "
        f"p50 {hold['p50']:.2f} ms, p99 {hold['p99']:.2f} ms, max {hold['max']:.2f} ms "
        f"(goal: p99 < 5 ms)",
        f"  write + commit (publish_snapshot, median of {args.writes}): "
        f"{result['write_ms_median']:.1f} ms, {result['snapshot_bytes'] / 1e6:.2f} MB",
        f"  restore (median of {args.restores}): read + verify {restore['read_verify']:.1f} ms, "
        f"RolloutRestorer.restore {restore['restore']:.1f} ms, together {restore['total']:.1f} "
        f"ms; raw read of the same {result['restore_raw_bytes'] / 1e6:.2f} MB {restore['raw_read']:.1f} "
        f"ms (goal: together <= 1.5 x raw + 100 ms = "
        f"{1.5 * restore['raw_read'] + 100:.1f} ms); besides, the run's collection between "
        f"them {restore['run_start_collect']:.1f} ms",
    ]
    if "incremental" in result:
        lines += ["", *incremental_report(result)]
    if "profile" in result:
        profile = result["profile"]
        lines += ["", "the cut hold, piece by piece (median ms of 10, timed separately):"]
        lines += [f"  {ms:9.2f}  {name}" for name, ms in profile["breakdown_ms"].items()]
        for what in ("capture", "write", "restore"):
            lines += ["", f"cProfile of one {what} (cumulative):", profile[what]]
    return "\n".join(lines)


def incremental_report(result: dict[str, Any]) -> list[str]:
    rounds = result["incremental"]
    steady = rounds[1:]
    lines = [
        "incremental snapshots: the first after restore (every row new), then "
        f"{len(steady)} steady-state rounds",
        "  round  new rows  new row MB  segment MB  index KB  ledger sidecar KB  "
        "ledger segment MB  records  fact segment KB  facts  other KB  data plane / new rows  "
        "total / new rows  build ms  write ms",
    ]
    for index, r in enumerate(rounds):
        new = max(r["new_row_bytes"], 1)
        lines.append(
            f"  {index:5d}  {r['new_rows']:8d}  {r['new_row_bytes'] / 1e6:10.3f}  "
            f"{r['segment_bytes'] / 1e6:10.3f}  {r['index'] / 1e3:8.1f}  "
            f"{r['ledger_sidecar'] / 1e3:17.1f}  {r['ledger_segment_bytes'] / 1e6:17.3f}  "
            f"{r['ledger_records_written']:7d}  {r['fact_segment_bytes'] / 1e3:15.1f}  "
            f"{r['facts_written']:5d}  {r['other_files'] / 1e3:8.1f}  "
            f"{r['data_plane_bytes'] / new:21.3f}  {r['total_bytes'] / new:16.2f}  "
            f"{r['build_ms']:8.1f}  {r['write_ms']:8.1f}"
        )
    if steady:
        data_plane = sum(r["data_plane_bytes"] for r in steady)
        new_bytes = sum(r["new_row_bytes"] for r in steady)
        total = sum(r["total_bytes"] for r in steady)
        ledger = sum(r["ledger_sidecar"] + r["ledger_segment_bytes"] for r in steady)
        lines += [
            f"  steady state: data plane {data_plane / new_bytes:.3f}x the new rows' bytes "
            f"(goal <= 1.1x); all files {total / new_bytes:.2f}x, of which the ledger "
            f"(sidecar + ledger segments) is {ledger / total:.0%} = "
            f"{ledger / new_bytes:.2f}x the new rows' bytes; median build "
            f"{statistics.median(r['build_ms'] for r in steady):.1f} ms, write "
            f"{statistics.median(r['write_ms'] for r in steady):.1f} ms; segments on disk "
            f"{rounds[-1]['segments_on_disk_bytes'] / 1e6:.2f} MB",
        ]
        per = {
            key: statistics.median(r[key] for r in steady)
            for key in (
                "ledger_segment_bytes",
                "ledger_sidecar",
                "other_files",
                "data_plane_bytes",
                "new_row_bytes",
                "ledger_records_written",
                "ledger_delta_records",
                "fact_segment_bytes",
                "facts_written",
                "controller_state",
                "replay_metadata",
                "group_facts_index",
                "total_bytes",
            )
        }
        lines.append(
            "  per snapshot (median): new rows {new_row_bytes:.0f} B; data plane "
            "{data_plane_bytes:.0f} B; ledger segments {ledger_segment_bytes:.0f} B "
            "({ledger_records_written:.0f} records, {ledger_delta_records:.0f} deltas); ledger "
            "sidecar {ledger_sidecar:.0f} B; fact segments {fact_segment_bytes:.0f} B "
            "({facts_written:.0f} facts); other files {other_files:.0f} B (controller state "
            "{controller_state:.0f} B, replay metadata {replay_metadata:.0f} B, group facts "
            "index {group_facts_index:.0f} B); all files {total_bytes:.0f} B".format(**per)
        )
    restore = result["incremental_restore_ms_median"]
    formats = result["formats"]
    lines += [
        f"  restore of the last one: read + verify {restore['read_verify']:.1f} ms "
        f"({restore['read_verify_cpu']:.1f} ms CPU), RolloutRestorer.restore "
        f"{restore['restore']:.1f} ms ({restore['restore_cpu']:.1f} ms CPU)",
        f"  its rows read from segments {formats['segments_read_ms']:.0f} ms vs the same rows "
        f"in the version 1 format ({formats['whole_bytes'] / 1e6:.2f} MB) "
        f"{formats['whole_read_ms']:.0f} ms (median of 3, alternated)",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--siblings", type=int, default=16)
    parser.add_argument("--canonical", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--writes", type=int, default=5)
    parser.add_argument("--restores", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--incremental", type=int, default=0)
    parser.add_argument("--seal-per-round", type=int, default=256)
    parser.add_argument("--finalize-per-round", type=int, default=8)
    parser.add_argument("--ledger-inline", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep --dir (to profile a restore)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="DOTPATH=VALUE",
        help="override the run's config (repeatable), e.g. the rows' length: "
        "gate.simulated.median_response_tokens=512",
    )
    args = parser.parse_args()
    if args.dir.exists():
        raise SystemExit(f"{args.dir} exists; remove it or pass another --dir")
    args.dir.mkdir(parents=True)
    try:
        result = asyncio.run(bench(args.dir, args))
    finally:
        if not args.keep:
            shutil.rmtree(args.dir)
    print(json.dumps(result, indent=2) if args.json else report(result, args))


if __name__ == "__main__":
    main()
