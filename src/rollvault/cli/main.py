"""``rollvault``: the command line.

``rollvault run [--config FILE] [dotpath=value ...]`` runs the asynchronous
GRPO pipeline with the run config (the packaged default unless ``--config``)
and any overrides, e.g. ``rollvault run grpo.num_generations_per_prompt=8``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rollvault.controller.config import ConfigError, load_run_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollvault", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the asynchronous GRPO pipeline")
    run.add_argument("--config", type=Path, default=None, help="YAML run config")
    run.add_argument("overrides", nargs="*", help="dotpath=value overrides")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        from rollvault.cli.run_command import run_command

        try:
            config = load_run_config(args.config, args.overrides)
        except ConfigError as error:
            print(f"rollvault run: {error}", file=sys.stderr)
            return 2
        return run_command(config)
    return 2


if __name__ == "__main__":
    sys.exit(main())
