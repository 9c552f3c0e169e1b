"""Re-read the measured loss of kept chaos runs (``bench_chaos.py --keep``), from their files.

Each run dir holds the run's logs and ``kill_evidence.json`` (what each kill
left on disk, written by the harness), so the loss account of
:mod:`rollvault.checkpoint_tools.chaos.loss` can be recomputed after a fix to
the accounting without running the kills again.

Usage: python benchmarks/chaos_reread.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from rollvault.checkpoint_tools.chaos.kill_evidence import (
    KILL_EVIDENCE_FILENAME,
    load_kill_evidence,
)
from rollvault.checkpoint_tools.chaos.loss import loss_account
from rollvault.checkpoint_tools.chaos.report import format_loss
from rollvault.checkpoint_tools.run_history import read_run_history, work_accounting


def main(run_dirs: list[str]) -> int:
    for name in run_dirs:
        run_dir = Path(name)
        history = read_run_history(run_dir / "logs")
        account = loss_account(history, load_kill_evidence(run_dir / KILL_EVIDENCE_FILENAME))
        accounting = work_accounting(history)
        print(
            f"{run_dir}: {len(account.kills)} kills, {accounting.generated_tokens} tokens "
            f"generated, {accounting.lost_tokens} lost (logged)"
        )
        print("\n".join(format_loss(account)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
