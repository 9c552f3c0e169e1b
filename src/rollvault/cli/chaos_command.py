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

from rollvault.checkpoint_tools.chaos.plan import (
    DEFAULT_KILL_WINDOW_S,
    ChaosPlan,
    ChaosUsageError,
)
from rollvault.checkpoint_tools.chaos.report import (
    IN_FLIGHT_NOTE,
    format_comparison,
    format_report,
)
from rollvault.checkpoint_tools.chaos.supervisor import run_chaos
from rollvault.config.errors import ConfigError
from rollvault.config.schema import RestoreMode


def parse_step_range(text: str) -> tuple[int, int]:
    """``LO:HI`` as ``(lo, hi)``; raises ``argparse.ArgumentTypeError`` unless 0 <= LO <= HI.

    argparse prefixes the message with the flag it was given to.
    """
    parts = text.split(":")
    if len(parts) != 2 or not all(part.strip().isdecimal() for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected LO:HI, two non-negative integers (train steps), got {text!r}"
        )
    lo, hi = (int(part) for part in parts)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"LO ({lo}) must not exceed HI ({hi}) in {text!r}")
    return lo, hi


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
    schedules = parser.add_mutually_exclusive_group()
    schedules.add_argument(
        "--kill-window",
        type=float,
        default=None,
        metavar="S",
        help=f"kill each start a seeded delay in [0, S) s after it (default {DEFAULT_KILL_WINDOW_S})",
    )
    schedules.add_argument(
        "--kill-after-steps",
        type=parse_step_range,
        default=None,
        metavar="LO:HI",
        help="kill each start once it trained a seeded number of steps in [LO, HI] (0: at once)",
    )
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
            kill_window_s=_kill_window(args),
            kill_after_steps=args.kill_after_steps,
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


def _kill_window(args: argparse.Namespace) -> float | None:
    """The timer's window: the flag's, else the default unless kills come by train steps."""
    if args.kill_window is not None:
        return float(args.kill_window)
    return None if args.kill_after_steps is not None else DEFAULT_KILL_WINDOW_S
