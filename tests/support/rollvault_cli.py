"""``python rollvault_cli.py ARGS`` is ``python -m rollvault.cli.main ARGS``, as a script file.

For :class:`child_zygote.Zygote`, which forks children of a script: a test
that starts many ``rollvault`` commands forks them from one process that has
imported the command line once.
"""

from __future__ import annotations

import sys

import rollvault.cli.run_command  # noqa: F401 - imported here so that the zygote preloads it
from rollvault.cli.main import entry

if __name__ == "__main__":
    sys.exit(entry())
