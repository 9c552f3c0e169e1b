"""One real vLLM server for every vLLM test of the session, started from the vLLM venv.

The venv is ``<repo>/.venv-vllm`` (``make vllm-venv`` creates it; ``make test``
depends on it), or the Python ``$ROLLVAULT_VLLM_PYTHON`` names. A missing venv
fails the tests that need the server: CI creates it, so a skip there would
hide that nothing was tested. The server is stopped (its process group, by
pid) when the session ends, whatever the tests did.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollvault.gates.vllm.client import VllmClient
from rollvault.gates.vllm.fleet import Fleet, Server
from rollvault.gates.vllm.launch import VLLM_PYTHON_ENV, LaunchSettings, ManagedServer, free_port
from rollvault.training.model_store import ensure_model_dir

REPO = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 240.0


def vllm_test_python() -> Path:
    """``$ROLLVAULT_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python``; fails if missing."""
    path = Path(os.environ.get(VLLM_PYTHON_ENV) or REPO / ".venv-vllm/bin/python")
    if not path.is_file():
        pytest.fail(
            f"no vLLM venv at {path}: run `make vllm-venv` (make test does), or set "
            f"${VLLM_PYTHON_ENV}"
        )
    return path


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model the server serves (built offline, seed 0)."""
    return ensure_model_dir(tmp_path_factory.mktemp("vllm") / "model", build_default=True, seed=0)


@pytest.fixture(scope="session")
def vllm_server(
    vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedServer]:
    """A running vLLM server on the tiny model (a fault test may kill and restart it)."""
    settings = LaunchSettings(python=str(vllm_test_python()), model_path=str(vllm_model_dir))
    log = tmp_path_factory.mktemp("vllm_logs") / "server.log"
    server = ManagedServer(settings, port=free_port(), log_path=log)
    server.start()
    try:
        asyncio.run(wait_healthy(server))
        yield server
    finally:
        server.stop()


async def wait_healthy(managed: ManagedServer) -> None:
    server = Server(client=VllmClient(managed.url, model="probe", timeout_s=5.0), managed=managed)
    fleet = Fleet([server], startup_timeout_s=STARTUP_TIMEOUT_S, max_restarts=0)
    try:
        await fleet.wait_healthy(server)
    finally:
        await server.client.close()
