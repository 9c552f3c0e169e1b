"""``rollvault``: the command line.

``rollvault run [--config FILE] [dotpath=value ...]`` runs the asynchronous
GRPO pipeline with the run config (the packaged default unless ``--config``)
and any overrides, e.g. ``rollvault run grpo.num_generations_per_prompt=8``.
``rollvault inspect CKPT_DIR [--json]`` summarizes a checkpoint directory and
``rollvault verify CKPT_DIR [--json]`` re-checks it fully (exit 1 on any problem).
``rollvault chaos [--config FILE] [--kills K] [--compare] [dotpath=value ...]``
SIGKILLs a real run K times, restarts it, and checks its evidence (exit 1 on
any problem).
``rollvault import-gguf (GGUF_FILE | --package DIST) OUT_DIR`` makes a GGUF
checkpoint into a local model directory, once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollvault", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the asynchronous GRPO pipeline")
    run.add_argument("--config", type=Path, default=None, help="YAML run config")
    run.add_argument("overrides", nargs="*", help="dotpath=value overrides")
    from rollvault.cli.chaos_command import add_chaos_arguments

    add_chaos_arguments(
        commands.add_parser("chaos", help="SIGKILL a real run K times, then check it")
    )
    from rollvault.cli.import_gguf_command import add_import_gguf_arguments

    add_import_gguf_arguments(
        commands.add_parser("import-gguf", help="make a GGUF file into a local model directory")
    )
    for name, help_text in (
        ("inspect", "summarize every anchor and snapshot of a checkpoint directory"),
        ("verify", "re-check every snapshot of a checkpoint directory; exit 1 on any problem"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("checkpoint_dir", type=Path, metavar="CKPT_DIR")
        command.add_argument("--json", action="store_true", help="print JSON instead of text")
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
    if args.command == "chaos":
        from rollvault.cli.chaos_command import chaos_command

        return chaos_command(args)
    if args.command == "import-gguf":
        from rollvault.cli.import_gguf_command import import_gguf_command

        return import_gguf_command(args)
    if args.command == "inspect":
        from rollvault.cli.inspect_command import inspect_command

        return inspect_command(args.checkpoint_dir, as_json=args.json)
    if args.command == "verify":
        from rollvault.cli.verify_command import verify_command

        return verify_command(args.checkpoint_dir, as_json=args.json)
    return 2


def entry() -> int:
    """The console script: :func:`main`, ending quietly when stdout's reader goes away.

    ``rollvault inspect --json DIR | head`` closes the pipe early; like any Unix
    filter the command then stops with the SIGPIPE exit status instead of a
    traceback. Nothing it writes to disk depends on stdout, so nothing is lost.
    """
    try:
        return main()
    except BrokenPipeError:
        # Python flushes stdout again at exit, which would raise once more:
        # point the descriptor at /dev/null first (the recipe in Python's signal docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(entry())
