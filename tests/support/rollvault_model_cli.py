""":mod:`rollvault_cli` with the model recipes' imports (torch, transformers) preloaded.

For a module whose commands run the GRPO recipe (``gate.kind: local_model``):
a start forked from a zygote that has imported these once skips the seconds a
new Python spends importing them before it builds the model (a two-step GRPO
run: 6-8 s forked against 9-12 s as a new Python, on two loaded cores).
"""

from __future__ import annotations

import sys

import rollvault.cli.run_command  # noqa: F401 - imported here so that the zygote preloads it
from rollvault.cli.main import entry

# Not in the run's spawned children (the generation worker, the trainer process), which
# import this script again as ``__mp_main__``: each imports what it needs itself.
if __name__ != "__mp_main__":
    import rollvault.recipes.model_run  # noqa: F401

if __name__ == "__main__":
    sys.exit(entry())
