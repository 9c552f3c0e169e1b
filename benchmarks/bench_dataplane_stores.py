"""Benchmark: the TransferQueue data plane against the embedded store, side by side (issue 15).

Both stores run in one process, on the same rows, one after the other:

- put and get one row per call (``--rows`` calls each: the gate stages one
  model call's row at a time), and in batches of ``--batch`` rows per call
  (the finalizer publishes a group's rows in one put, the trainer gets a
  step's rows in one get); reported per row;
- a snapshot of ``--snapshot-rows`` rows: the capture inside the cut, the
  write in the snapshot format (safetensors + metadata.json; for
  TransferQueue this includes fetching every row back out of it), and the
  restore (``load_checkpoint`` into a fresh store, which for TransferQueue
  puts every row into it again); medians of ``--repeat``.

Rows look like the GRPO recipe's canonical rows: ``--tokens`` int64 token ids,
float32 logprobs, a bool mask, and four scalars. TransferQueue runs with one
storage unit on a private local Ray (see ``rollvault.dataplane.tq.session``).

Usage: python benchmarks/bench_dataplane_stores.py [--rows 300] [--batch 32]
       [--snapshot-rows 2048] [--tokens 64] [--repeat 3] [--json]
The snapshot files go to .bench_tmp/dataplane_stores/ in the checkout and are
removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import EmbeddedDataPlane, Row
from rollvault.dataplane.interface import DataPlane
from rollvault.dataplane.tq import (
    TransferQueueDataPlane,
    TransferQueueSettings,
    start_transfer_queue,
)

PlaneFactory = Callable[[DataPlaneMutationCut], DataPlane]
WORK_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "dataplane_stores"


def make_row(seed: int, tokens: int) -> Row:
    """A canonical-row-shaped row, distinct per ``seed``."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 50_000, tokens, dtype=np.int64),
        "generation_logprobs": rng.standard_normal(tokens).astype(np.float32),
        "token_mask": rng.integers(0, 2, tokens).astype(bool),
        "reward": float(seed % 7) / 7,
        "advantage": float(seed % 5) - 2.0,
        "length": tokens,
        "truncated": bool(seed % 2),
    }


async def per_row(make: PlaneFactory, rows: dict[str, Row], batch: int) -> dict[str, float]:
    """Microseconds per row of put, get and clear, ``batch`` rows per call."""
    plane = make(DataPlaneMutationCut())
    keys = list(rows)
    batches = [keys[start : start + batch] for start in range(0, len(keys), batch)]
    started = time.perf_counter()
    for chunk in batches:
        await plane.put("train", {key: rows[key] for key in chunk})
    put_s = time.perf_counter() - started
    started = time.perf_counter()
    for chunk in batches:
        await plane.get("train", chunk)
    get_s = time.perf_counter() - started
    started = time.perf_counter()
    for chunk in batches:
        await plane.clear("train", chunk)
    clear_s = time.perf_counter() - started
    return {
        "put_us": put_s / len(keys) * 1e6,
        "get_us": get_s / len(keys) * 1e6,
        "clear_us": clear_s / len(keys) * 1e6,
    }


async def snapshot(make: PlaneFactory, rows: dict[str, Row], directory: Path) -> dict[str, float]:
    """Milliseconds of one capture, one write and one restore of ``rows``."""
    cut = DataPlaneMutationCut()
    plane = make(cut)
    for start in range(0, len(rows), 512):
        await plane.put("train", dict(list(rows.items())[start : start + 512]))
    started = time.perf_counter()
    async with cut.checkpoint():
        capture = plane.capture()
    capture_s = time.perf_counter() - started
    started = time.perf_counter()
    info = await plane.save_checkpoint(directory, {}, capture)
    write_s = time.perf_counter() - started
    del capture
    await plane.clear("train", list(rows))
    restored = make(DataPlaneMutationCut())
    started = time.perf_counter()
    await restored.load_checkpoint(directory)
    restore_s = time.perf_counter() - started
    assert restored.row_count() == len(rows)
    await restored.clear("train", list(rows))
    shutil.rmtree(directory)
    return {
        "capture_ms": capture_s * 1e3,
        "write_ms": write_s * 1e3,
        "restore_ms": restore_s * 1e3,
        "bytes": float(info.bytes_written),
    }


def median_of(results: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(result[key] for result in results) for key in results[0]}


async def measure(args: argparse.Namespace, stores: dict[str, PlaneFactory]) -> dict[str, Any]:
    rows = {f"g{i}_g{i % 16}": make_row(i, args.tokens) for i in range(args.rows)}
    big = {f"s{i}_g{i % 16}": make_row(i, args.tokens) for i in range(args.snapshot_rows)}
    out: dict[str, Any] = {}
    for name, make in stores.items():
        await per_row(make, dict(list(rows.items())[:20]), 1)  # warm-up: sockets, imports
        out[name] = {
            "one_per_call": median_of([await per_row(make, rows, 1) for _ in range(args.repeat)]),
            "batched": median_of(
                [await per_row(make, rows, args.batch) for _ in range(args.repeat)]
            ),
            "snapshot": median_of(
                [await snapshot(make, big, WORK_DIR / f"{name}_{i}") for i in range(args.repeat)]
            ),
        }
    return out


def table(results: dict[str, Any], args: argparse.Namespace) -> str:
    embedded, tq = results["embedded"], results["transfer_queue"]
    lines = [
        "| figure | embedded | TransferQueue | TQ / embedded |",
        "|---|---|---|---|",
    ]
    for group, label in (
        ("one_per_call", "1 row per call"),
        ("batched", f"{args.batch} rows per call"),
    ):
        for op in ("put", "get", "clear"):
            key = f"{op}_us"
            e, t = embedded[group][key], tq[group][key]
            lines.append(f"| {op}, {label}, per row | {e:,.1f} us | {t:,.1f} us | {t / e:,.0f}x |")
    for key, label in (
        ("capture_ms", "capture in the cut"),
        ("write_ms", "write"),
        ("restore_ms", "restore"),
    ):
        e, t = embedded["snapshot"][key], tq["snapshot"][key]
        lines.append(
            f"| snapshot of {args.snapshot_rows:,} rows: {label} | {e:,.2f} ms | {t:,.2f} ms "
            f"| {t / e:,.1f}x |"
        )
    size = embedded["snapshot"]["bytes"], tq["snapshot"]["bytes"]
    lines.append(f"| snapshot bytes | {size[0]:,.0f} | {size[1]:,.0f} | {size[1] / size[0]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--snapshot-rows", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    session = start_transfer_queue(TransferQueueSettings(num_storage_units=1, init_timeout_s=300))
    start_s = time.perf_counter() - started
    try:
        results = asyncio.run(
            measure(args, {"embedded": EmbeddedDataPlane, "transfer_queue": TransferQueueDataPlane})
        )
    finally:
        session.close()
        shutil.rmtree(WORK_DIR, ignore_errors=True)
    results["transfer_queue_start_s"] = start_s
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results, args))
        print(f"\nTransferQueue start (Ray + controller + 1 storage unit): {start_s:.1f} s")


if __name__ == "__main__":
    main()
