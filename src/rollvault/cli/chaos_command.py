"""``rollvault chaos``: the harness's command line (see :mod:`rollvault.checkpoint_tools.chaos`).

Parses the options, runs the harness once per restore mode and prints each
report (and, with ``--compare``, both modes' work lost side by side). Exits 0
when no invariant failed, 1 when one did, 2 when the harness cannot run as
asked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rollvault.checkpoint_tools.chaos.plan import ChaosPlan, ChaosUsageError
from rollvault.checkpoint_tools.chaos.report import (
    IN_FLIGHT_NOTE,
    format_comparison,
    format_report,
)
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.config.errors import ConfigError
from rollvault.config.schema import RestoreMode


def add_chaos_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``chaos`` subcommand's options."""
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs before the last start")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill schedule")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--restore-mode",
        choices=[RestoreMode.LATEST.value, RestoreMode.TRAINER_CHECKPOINT.value],
        default=RestoreMode.LATEST.value,
    )
    modes.add_argument(
        "--compare",
        action="store_true",
        help="run the same kills under latest and trainer_checkpoint and compare work lost",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument(
        "--config", type=Path, default=None, help="YAML run config (default: the packaged one)"
    )
    parser.add_argument("--kill-window", type=float, default=1.0, help="max seconds to a kill")
    parser.add_argument("--timeout", type=float, default=120.0, help="max seconds per start")
    parser.add_argument("overrides", nargs="*", help="dotpath=value overrides of the run config")


def chaos_command(args: argparse.Namespace) -> int:
    """Run the harness as the command line asked; 0 when no invariant failed."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rollvault-chaos-"))
    modes = (
        [RestoreMode.LATEST, RestoreMode.TRAINER_CHECKPOINT]
        if args.compare
        else [RestoreMode(args.restore_mode)]
    )
    reports = []
    for mode in modes:
        plan = ChaosPlan(
            run_dir=workdir / mode.value,
            kills=args.kills,
            seed=args.seed,
            restore_mode=mode,
            overrides=tuple(args.overrides),
            config_path=args.config,
            kill_window_s=args.kill_window,
            start_timeout_s=args.timeout,
        )
        try:
            reports.append(run_chaos(plan))
        except (ChaosUsageError, ConfigError) as error:
            print(f"rollvault chaos: {error}", file=sys.stderr)
            return 2
        print(format_report(reports[-1]), flush=True)
    if args.compare:
        print(format_comparison(reports[0], reports[1]))
    else:
        print(f"  note: {IN_FLIGHT_NOTE}")
    return 1 if any(report.problems for report in reports) else 0
