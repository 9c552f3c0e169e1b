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

Usage: python benchmarks/bench_snapshot_cut.py [--groups 1024] [--siblings 16]
       [--canonical 96] [--repeat 100] [--writes 5] [--restores 3] [--profile] [--json]
The files go to .bench_tmp/snapshot_cut/ in the checkout (not /tmp, which
may be tmpfs where fsync costs nothing) and are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
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
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir, run_fingerprint
from rollvault.controller.snapshots.snapshot_files import (
    RolloutStateCapture,
    write_snapshot_payload,
)
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.publish import publish_snapshot
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.sidecar import build_rollout_recovery_state
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
    return load_run_config(
        None,
        [
            f"dataset.num_prompts={total}",
            f"grpo.num_generations_per_prompt={args.siblings}",
            f"grpo.num_prompts_per_step={PROMPTS_PER_STEP}",
            f"sampler.max_lookahead_versions={-(-total // PROMPTS_PER_STEP)}",
            f"rollout.max_inflight_prompts={args.groups}",
            f"rollout.max_buffered_rollouts={2 * total}",
            f"logging.log_dir={root / 'logs'}",
            f"checkpointing.checkpoint_dir={root / 'checkpoints'}",
            "logging.progress=false",
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
    started = time.perf_counter()
    source = prepare_checkpoint_dir(config)
    resolved = time.perf_counter()
    if source is None or source.snapshot is None:
        raise RuntimeError("the benchmark's snapshot was not found for restore")
    parts = build_parts(config, dataset=_dataset(config))
    restorer = RolloutRestorer(
        parts,
        trainer=RecordingTrainer(),
        buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
        resume=source,
    )
    await restorer.restore()
    finished = time.perf_counter()
    parts.logs.close()
    restored = len(parts.ledger) + len(parts.replay)
    expected = args.groups + args.canonical
    if restored != expected:
        raise RuntimeError(f"restored {restored} groups, expected {expected}")
    raw_seconds, raw_bytes = raw_read(source.snapshot.path)
    return {
        "read_verify": resolved - started,
        "restore": finished - resolved,
        "total": finished - started,
        "raw_read": raw_seconds,
        "raw_bytes": raw_bytes,
    }


def raw_read(snapshot: Path) -> tuple[float, int]:
    """Seconds to read every byte of the snapshot's files, the floor a restore is held to.

    Run right after the restore read the same files, so both find them in the
    page cache alike.
    """
    files = sorted(path for path in snapshot.rglob("*") if path.is_file())
    started = time.perf_counter()
    size = sum(len(path.read_bytes()) for path in files)
    return time.perf_counter() - started, size


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
        f"{1.5 * restore['raw_read'] + 100:.1f} ms)",
    ]
    if "profile" in result:
        profile = result["profile"]
        lines += ["", "the cut hold, piece by piece (median ms of 10, timed separately):"]
        lines += [f"  {ms:9.2f}  {name}" for name, ms in profile["breakdown_ms"].items()]
        for what in ("capture", "write", "restore"):
            lines += ["", f"cProfile of one {what} (cumulative):", profile[what]]
    return "\n".join(lines)


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
    args = parser.parse_args()
    if args.dir.exists():
        raise SystemExit(f"{args.dir} exists; remove it or pass another --dir")
    args.dir.mkdir(parents=True)
    try:
        result = asyncio.run(bench(args.dir, args))
    finally:
        shutil.rmtree(args.dir)
    print(json.dumps(result, indent=2) if args.json else report(result, args))


if __name__ == "__main__":
    main()
