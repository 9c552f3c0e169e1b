"""What a long seal journal costs a restore (issue 16; periodic snapshots a minute apart).

Runs the GRPO recipe (``configs/grpo_addition.yaml``) with no trainer checkpoint and no
periodic snapshot, so that everything it seals stays in the seal journal; SIGKILLs it
once it has trained ``--steps`` steps; starts the same command again; and reports the
journal's size on disk at the kill, the restore's ``restores.jsonl`` line (its
``seconds``: reading, verifying, decoding and pooling the journal) and the wall time the
second start takes to train the same number of steps again (its journaled seals are
adopted, not generated), beside the first start's.

Usage: python benchmarks/bench_journal_restore.py --steps N --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

RECIPE = Path(__file__).resolve().parent.parent / "src/rollvault/configs/grpo_addition.yaml"
POLL_S = 0.05


def command(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rollvault.cli.main",
        "run",
        "--config",
        str(RECIPE),
        "trainer.warmup.steps=0",
        "checkpointing.save_period=100000",
        "rollout_checkpointing.interval_s=100000",
        f"checkpointing.checkpoint_dir={out / 'checkpoints'}",
        f"logging.log_dir={out / 'logs'}",
        f"model.path={out / 'model'}",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]


def log_lines(out: Path, name: str) -> list[str]:
    path = out / "logs" / name
    return path.read_text().splitlines() if path.exists() else []


def wait_for(process: subprocess.Popen[bytes], done: Callable[[], object], what: str) -> float:
    """Poll ``done()`` (a measurement script's loop, not synchronization of the system
    under test) until it is true; the time it became true."""
    while not done():
        if process.poll() is not None:
            raise SystemExit(f"the run ended with {process.returncode} before {what}")
        time.sleep(POLL_S)
    return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True, help="train steps before the kill")
    parser.add_argument("--out", type=Path, required=True, help="a directory it may empty")
    args = parser.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ)
    with open(out / "first.log", "wb") as log:
        first = subprocess.Popen(command(out), env=env, stdout=log, stderr=subprocess.STDOUT)
        started = wait_for(first, lambda: log_lines(out, "metrics.jsonl"), "its first step")
        ended = wait_for(
            first, lambda: len(log_lines(out, "metrics.jsonl")) >= args.steps, "the kill"
        )
        first.send_signal(signal.SIGKILL)
        first.wait()
    journal = sum(path.stat().st_size for path in (out / "checkpoints" / "journal").iterdir())
    trained = len(log_lines(out, "metrics.jsonl"))
    with open(out / "second.log", "wb") as log:
        second = subprocess.Popen(command(out), env=env, stdout=log, stderr=subprocess.STDOUT)
        restarted = time.monotonic()
        restored = wait_for(second, lambda: log_lines(out, "restores.jsonl"), "its restore")
        again = wait_for(
            second,
            lambda: len(log_lines(out, "metrics.jsonl")) >= trained + args.steps,
            "the same steps again",
        )
        second.send_signal(signal.SIGKILL)
        second.wait()
    restore = json.loads(log_lines(out, "restores.jsonl")[-1])
    print(
        json.dumps(
            {
                "steps": args.steps,
                "journal_mib": round(journal / 2**20, 2),
                "restore_s": round(restore["seconds"], 3),
                "journal_records": restore["journal_records"],
                "start_to_restore_line_s": round(restored - restarted, 2),
                "first_run_steps_s": round(ended - started, 2),
                "second_run_same_steps_s": round(again - restored, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
