"""``rollvault verify CKPT_DIR``: re-check every snapshot of a checkpoint directory fully.

What is checked is :mod:`rollvault.checkpoint_tools.verify`. Prints one line
per problem, naming the file, then a summary; exits 1 when anything is wrong,
0 when all is well, 2 when the directory holds no run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from rollvault.checkpoint_tools.inventory import no_run_message
from rollvault.checkpoint_tools.verify import VerifyReport, verify_checkpoint_dir
from rollvault.durable.bootstrap import holds_run


def verify_command(checkpoint_dir: Path, *, as_json: bool) -> int:
    """Run ``rollvault verify``; returns the exit code."""
    if not checkpoint_dir.is_dir() or not holds_run(checkpoint_dir):
        print(f"rollvault verify: {no_run_message(checkpoint_dir)}", file=sys.stderr)
        return 2
    report = verify_checkpoint_dir(checkpoint_dir)
    if as_json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        _print_report(report)
    return 0 if report.ok else 1


def _print_report(report: VerifyReport) -> None:
    for problem in report.problems:
        print(f"{problem.path}: {problem.problem}")
    for leftover in report.leftovers:
        print(f"note: {leftover} is a leftover of an interrupted write or prune (never read)")
    verdict = "all good" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"rollvault verify: {report.checkpoint_dir}: checked {len(report.snapshots_checked)} "
        f"snapshot(s): {verdict}"
    )
