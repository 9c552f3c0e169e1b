"""Benchmark of snapshot commit latency against a raw write + fsync (issue 3).

For each total size (default 1 MB, 64 MB, 512 MB split into 8 files) it
measures, interleaved repetition by repetition on the same disk:

- raw: write the 8 files and fsync each one (the floor any durable write pays);
- commit: ``prepare_snapshot_paths`` + write the same 8 files and a manifest
  into the tmp dir + ``commit_snapshot(keep_latest_k=2)``: fsync of every
  file and directory, rename, parent fsync (the snapshot is now durable and
  visible: "published"), then retention, which in steady state renames the
  oldest snapshot to trash, fsyncs, and deletes it.

It prints medians of raw, published and full commit, the ratios of the
medians to raw, and the commit's phases. "published" is read at the
``commit.parent_synced`` fault point, whose production no-op this script
replaces with a clock read. ``sync`` runs before each timed operation so
neither inherits the other's dirty pages; the order of raw and commit
alternates between repetitions.

Usage: python benchmarks/bench_snapshot_commit.py [--dir DIR] [--sizes-mb 1,64,512]
       [--files 8] [--repeat 5] [--json]
The default directory is .bench_tmp/ in the checkout (not /tmp, which may be
tmpfs where fsync costs nothing); it refuses a tmpfs directory. Everything it
creates is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rollvault.durable import snapshot_dirs
from rollvault.rollout_checkpointing.manifest import (
    RolloutSnapshotManifest,
    commit_snapshot,
    prepare_snapshot_paths,
    write_snapshot_manifest,
)

DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench_tmp" / "snapshot_commit"
MB = 1024 * 1024


def filesystem_type(path: Path) -> str:
    """Type of the filesystem holding ``path`` (longest matching mount point)."""
    best, best_type = "", "unknown"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        _device, mount_point, fs_type, *_ = line.split()
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, best_type = mount_point, fs_type
    return best_type


def write_files(directory: Path, blobs: list[bytes], *, fsync: bool) -> None:
    for index, blob in enumerate(blobs):
        with open(directory / f"part_{index}.bin", "wb") as handle:
            handle.write(blob)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())


def raw_write(root: Path, blobs: list[bytes], repetition: int) -> dict[str, float]:
    directory = root / f"raw_{repetition}"
    directory.mkdir()
    start = time.perf_counter()
    write_files(directory, blobs, fsync=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(directory)
    return {"total": elapsed}


def manifest(sequence: int) -> RolloutSnapshotManifest:
    return RolloutSnapshotManifest(
        schema_version=3,
        base_train_step=0,
        trainer_version=0,
        current_epoch=0,
        sampler_dispatch_index=sequence,
        mutation_version=sequence,
        rolled_back_train_group_count=0,
        bootstrap_fingerprint=None,
        next_nemo_gym_task_index=None,
    )


_PUBLISHED: list[float] = []


def _clock_at_publication(name: str) -> None:
    if name == "commit.parent_synced":
        _PUBLISHED.append(time.perf_counter())


def snapshot_commit(anchor: Path, blobs: list[bytes]) -> dict[str, float]:
    _PUBLISHED.clear()
    start = time.perf_counter()
    tmp_path, final_path, sequence = prepare_snapshot_paths(anchor)
    prepared = time.perf_counter()
    write_files(tmp_path, blobs, fsync=False)
    write_snapshot_manifest(tmp_path, manifest(sequence))
    written = time.perf_counter()
    commit_snapshot(tmp_path, final_path, keep_latest_k=2)
    done = time.perf_counter()
    [published] = _PUBLISHED
    return {
        "total": done - start,
        "published": published - start,
        "prepare": prepared - start,
        "write": written - prepared,
        "flush_and_rename": published - written,
        "retention": done - published,
    }


def bench_size(root: Path, total_bytes: int, files: int, repeat: int) -> dict[str, Any]:
    blobs = [os.urandom(total_bytes // files) for _ in range(files)]
    anchor = root / f"anchor_{total_bytes}"
    anchor.mkdir()
    # Two warm-up commits so every timed one runs retention as in steady state.
    for _ in range(2):
        snapshot_commit(anchor, blobs)
    raw: list[dict[str, float]] = []
    commit: list[dict[str, float]] = []
    for repetition in range(repeat):
        order = ("raw", "commit") if repetition % 2 == 0 else ("commit", "raw")
        for kind in order:
            os.sync()
            if kind == "raw":
                raw.append(raw_write(root, blobs, repetition))
            else:
                commit.append(snapshot_commit(anchor, blobs))
    shutil.rmtree(anchor)
    raw_median = statistics.median(r["total"] for r in raw)
    published_median = statistics.median(c["published"] for c in commit)
    commit_median = statistics.median(c["total"] for c in commit)
    return {
        "size_bytes": total_bytes,
        "files": files,
        "repeat": repeat,
        "raw_median_s": raw_median,
        "published_median_s": published_median,
        "commit_median_s": commit_median,
        "published_ratio": published_median / raw_median,
        "commit_ratio": commit_median / raw_median,
        "commit_phase_medians_s": {
            phase: statistics.median(c[phase] for c in commit)
            for phase in ("prepare", "write", "flush_and_rename", "retention")
        },
        "raw_s": [r["total"] for r in raw],
        "published_s": [c["published"] for c in commit],
        "commit_s": [c["total"] for c in commit],
    }


def print_table(results: list[dict[str, Any]], directory: Path, fs_type: str) -> None:
    print(f"snapshot commit vs raw write+fsync in {directory} ({fs_type}), medians")
    print(
        f"{'size':>7} {'raw':>9} {'published':>10} {'ratio':>6} {'commit':>9} {'ratio':>6}"
        "   commit phases"
    )
    for row in results:
        phases = "  ".join(
            f"{name} {seconds * 1e3:.1f}" for name, seconds in row["commit_phase_medians_s"].items()
        )
        print(
            f"{row['size_bytes'] / MB:>5.0f}MB {row['raw_median_s'] * 1e3:>7.1f}ms "
            f"{row['published_median_s'] * 1e3:>8.1f}ms {row['published_ratio']:>6.2f} "
            f"{row['commit_median_s'] * 1e3:>7.1f}ms {row['commit_ratio']:>6.2f}   {phases} (ms)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--sizes-mb", default="1,64,512")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    root: Path = args.dir
    snapshot_dirs.fault_point = _clock_at_publication
    root.mkdir(parents=True, exist_ok=False)
    try:
        fs_type = filesystem_type(root)
        if fs_type == "tmpfs":
            print(
                f"{root} is on tmpfs, where fsync is free; use --dir on a real disk",
                file=sys.stderr,
            )
            return 2
        sizes = [int(float(size) * MB) for size in args.sizes_mb.split(",")]
        results = [bench_size(root, size, args.files, args.repeat) for size in sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"dir": str(root), "filesystem": fs_type, "results": results}, indent=2))
    else:
        print_table(results, root, fs_type)
    return 0


if __name__ == "__main__":
    sys.exit(main())
