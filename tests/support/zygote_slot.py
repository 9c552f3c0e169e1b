"""A test module's :class:`~child_zygote.Zygote`: started by the module's fixture, used by its helpers.

A module writes ``CLI = ZygoteSlot(ROLLVAULT_CLI, timeout_s=300)`` and
``_cli_zygote = CLI.module_fixture()``; its helpers call ``CLI.run(...)``. The
zygote lives for the module's tests only and is closed after them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from child_zygote import Zygote

ROLLVAULT_CLI = Path(__file__).parent / "rollvault_cli.py"
"""The ``rollvault`` command line as a child script (``python -m rollvault.cli.main``)."""

ROLLVAULT_MODEL_CLI = Path(__file__).parent / "rollvault_model_cli.py"
"""The same command line with torch and the model recipes preloaded: for GRPO-recipe runs."""


class ZygoteSlot:
    """The zygote of one child script for one test module (see the module docstring)."""

    def __init__(self, child: Path, *, timeout_s: float = 60.0) -> None:
        self.child = child
        self.timeout_s = timeout_s
        self._zygote: Zygote | None = None

    def module_fixture(self) -> Callable[[], Iterator[None]]:
        """An autouse, module-scoped fixture that runs the zygote around the module's tests."""

        @pytest.fixture(scope="module", autouse=True)
        def _zygote_running() -> Iterator[None]:
            with Zygote(self.child, timeout_s=self.timeout_s) as zygote:
                self._zygote = zygote
                try:
                    yield
                finally:
                    self._zygote = None

        return _zygote_running

    @property
    def zygote(self) -> Zygote:
        """The module's running zygote (for :meth:`Zygote.start`, say)."""
        assert self._zygote is not None, f"the zygote of {self.child} is not running"
        return self._zygote

    def run(
        self, argv: list[str], env: Mapping[str, str], *, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """:meth:`Zygote.run` on the module's zygote."""
        return self.zygote.run(argv, env, cwd=cwd)
