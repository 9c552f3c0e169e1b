"""Child process of the crash tests: commits, prunes and verifies snapshots.

Run as ``python durable_crash_child.py <mode> <checkpoint_dir>``. The crash
tests start it with ``ROLLVAULT_FAULT_KILL_AT``/``ROLLVAULT_FAULT_TRACE`` set
(see rollvault.durable.faults) or kill it at random moments.

Every snapshot carries payload files whose content is derived from its
sequence number and a ``payload.json`` listing their SHA-256 digests, so a
fresh process can check that each committed snapshot is complete.

Modes:
  anchor   create (or validate) the bootstrap anchor
  commit   publish one snapshot under the bootstrap anchor (keep_latest_k=2)
  loop     publish snapshots forever, printing "committed <seq>" after each
  prune    prune the bootstrap snapshots (a trainer checkpoint step_000001 exists)
  verify   print a JSON report of the directory; with --commit, publish one
           more snapshot afterwards and report again
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from rollvault.rollout_checkpointing.manifest import (
    BOOTSTRAP_DIRNAME,
    ROLLOUT_SNAPSHOTS_DIRNAME,
    RolloutSnapshotManifest,
    SnapshotError,
    _snapshot_sequence,
    bootstrap_compatibility_identity,
    commit_snapshot,
    ensure_bootstrap_anchor,
    prepare_snapshot_paths,
    prune_bootstrap_snapshots,
    read_snapshot_manifest,
    resolve_latest_snapshot,
    write_snapshot_manifest,
)

CONFIG: dict[str, Any] = {
    "grpo": {"num_generations_per_prompt": 4, "lr": 1e-6},
    "logger": {"log_dir": "/tmp/logs"},
}
IDENTITY = bootstrap_compatibility_identity(CONFIG)
KEEP_LATEST_K = 2
PAYLOAD_FILES = 2
PAYLOAD_BYTES = 16 * 1024
TRAINER_CHECKPOINT = "step_000001"


def payload_bytes(sequence: int, index: int) -> bytes:
    block = hashlib.sha256(f"{sequence}:{index}".encode()).digest()
    return (block * (PAYLOAD_BYTES // len(block) + 1))[:PAYLOAD_BYTES]


def write_payload(tmp_path: Path, sequence: int) -> None:
    digests = {}
    (tmp_path / "data_plane").mkdir()
    for index in range(PAYLOAD_FILES):
        name = f"data_plane/rows_{index}.bin"
        data = payload_bytes(sequence, index)
        (tmp_path / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    listing = {"sequence": sequence, "files": digests}
    (tmp_path / "payload.json").write_text(json.dumps(listing, sort_keys=True))


def manifest_for(sequence: int) -> RolloutSnapshotManifest:
    return RolloutSnapshotManifest(
        schema_version=3,
        base_train_step=0,
        trainer_version=0,
        current_epoch=0,
        sampler_dispatch_index=sequence * 10,
        mutation_version=sequence,
        rolled_back_train_group_count=0,
        bootstrap_fingerprint=IDENTITY.fingerprint(),
        next_nemo_gym_task_index=None,
    )


def commit_one(checkpoint_dir: Path) -> int:
    anchor = ensure_bootstrap_anchor(checkpoint_dir, identity=IDENTITY)
    tmp_path, final_path, sequence = prepare_snapshot_paths(anchor)
    write_payload(tmp_path, sequence)
    write_snapshot_manifest(tmp_path, manifest_for(sequence))
    commit_snapshot(tmp_path, final_path, keep_latest_k=KEEP_LATEST_K)
    return sequence


def _file_index(name: str) -> int:
    return int(name.removeprefix("data_plane/rows_").removesuffix(".bin"))


def snapshot_problem(path: Path) -> str | None:
    """Why a committed snapshot is incomplete, or None when it is complete."""
    try:
        manifest = read_snapshot_manifest(path)
        listing = json.loads((path / "payload.json").read_text())
    except (SnapshotError, OSError, ValueError) as exc:
        return str(exc)
    sequence = _snapshot_sequence(path)
    if listing["sequence"] != sequence or manifest.mutation_version != sequence:
        return f"sequence mismatch: dir {sequence}, payload {listing['sequence']}"
    expected = {f"data_plane/rows_{i}.bin" for i in range(PAYLOAD_FILES)}
    if set(listing["files"]) != expected:
        return f"payload lists {sorted(listing['files'])}"
    for name, digest in listing["files"].items():
        data = (path / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest or data != payload_bytes(
            sequence, _file_index(name)
        ):
            return f"{name}: content differs from what was written"
    return None


def verify_payload(path: Path, manifest: RolloutSnapshotManifest) -> None:
    problem = snapshot_problem(path)
    if problem is not None:
        raise SnapshotError(problem)


def report(checkpoint_dir: Path) -> dict[str, Any]:
    anchor = checkpoint_dir / BOOTSTRAP_DIRNAME
    root = anchor / ROLLOUT_SNAPSHOTS_DIRNAME
    entries = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    committed = [name for name in entries if name.startswith("snapshot_")]
    problems = {name: snapshot_problem(root / name) for name in committed}
    resolved = resolve_latest_snapshot(
        anchor,
        expected_train_step=0,
        expected_trainer_version=0,
        expected_bootstrap_fingerprint=IDENTITY.fingerprint(),
        verify_snapshot=verify_payload,
    )
    return {
        "entries": entries,
        "anchor_entries": sorted(p.name for p in anchor.iterdir()) if anchor.is_dir() else [],
        "committed": [_snapshot_sequence(root / name) for name in committed],
        "problems": {name: problem for name, problem in problems.items() if problem},
        "resolved": None if resolved is None else resolved.manifest.mutation_version,
    }


def main(argv: list[str]) -> int:
    mode, checkpoint_dir = argv[0], Path(argv[1])
    if mode == "anchor":
        ensure_bootstrap_anchor(checkpoint_dir, identity=IDENTITY)
    elif mode == "commit":
        commit_one(checkpoint_dir)
    elif mode == "loop":
        while True:
            print(f"committed {commit_one(checkpoint_dir)}", flush=True)
    elif mode == "prune":
        trainer_checkpoint = checkpoint_dir / TRAINER_CHECKPOINT
        trainer_checkpoint.mkdir(exist_ok=True)
        pruned = prune_bootstrap_snapshots(
            checkpoint_dir, durable_trainer_checkpoint=trainer_checkpoint
        )
        print(json.dumps({"pruned": pruned}))
    elif mode == "verify":
        ensure_bootstrap_anchor(checkpoint_dir, identity=IDENTITY)
        result: dict[str, Any] = {"before": report(checkpoint_dir)}
        if "--commit" in argv:
            result["committed_sequence"] = commit_one(checkpoint_dir)
            result["after"] = report(checkpoint_dir)
        print(json.dumps(result))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
