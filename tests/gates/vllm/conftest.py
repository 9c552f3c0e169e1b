"""One real vLLM server for every vLLM test of the session, started from the vLLM venv.

The venv is ``<repo>/.venv-vllm`` (``make vllm-venv`` creates it; ``make test``
depends on it), or the Python ``$ROLLVAULT_VLLM_PYTHON`` names. A missing venv
fails the tests that need the server: CI creates it, so a skip there would
hide that nothing was tested. The server is stopped (its process group, by
pid) when the session ends, whatever the tests did.

A start takes about a minute, so the server is launched as soon as collection
finds a test that needs it (:func:`pytest_collection_finish`), and loads while
the tests before the vLLM ones run. Until its first test asks for it, it runs
at a lower CPU priority (nice ``EARLY_NICENESS``), so on a small machine it
takes the cores the other tests leave idle instead of slowing them down.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollvault.gates.vllm.client import VllmClient
from rollvault.gates.vllm.fleet import Fleet, Server
from rollvault.gates.vllm.launch import VLLM_PYTHON_ENV, LaunchSettings, ManagedServer, free_port
from rollvault.training.model_store import ensure_model_dir

REPO = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 240.0
EARLY_NICENESS = 10
SERVER_FIXTURE = "vllm_server"


def _vllm_python_path() -> Path:
    return Path(os.environ.get(VLLM_PYTHON_ENV) or REPO / ".venv-vllm/bin/python")


def vllm_test_python() -> Path:
    """``$ROLLVAULT_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python``; fails if missing."""
    path = _vllm_python_path()
    if not path.is_file():
        pytest.fail(
            f"no vLLM venv at {path}: run `make vllm-venv` (make test does), or set "
            f"${VLLM_PYTHON_ENV}"
        )
    return path


@dataclass
class _EarlyServer:
    """The session's server, launched when collection ends, and the directory it lives in."""

    directory: Path
    model_dir: Path
    server: ManagedServer


_early: _EarlyServer | None = None


def _launch(python: Path, directory: Path) -> _EarlyServer:
    model_dir = ensure_model_dir(directory / "model", build_default=True, seed=0)
    return _EarlyServer(directory, model_dir, _start_server(python, model_dir, directory))


def _start_server(python: Path, model_dir: Path, directory: Path) -> ManagedServer:
    settings = LaunchSettings(python=str(python), model_path=str(model_dir))
    server = ManagedServer(settings, port=free_port(), log_path=directory / "logs" / "server.log")
    server.start()
    return server


def _set_niceness(server: ManagedServer, niceness: int) -> None:
    """Set the niceness of every thread of the server's process group (its pid: its own
    session). The engine processes it spawns later inherit it."""
    if server.pid is None:
        return
    try:
        os.setpriority(os.PRIO_PGRP, server.pid, niceness)
    except PermissionError:
        # Lowering niceness back needs CAP_SYS_NICE: without it the server stays
        # nicer, which only matters if something else competes for the CPU.
        return
    except ProcessLookupError:
        return  # the server already exited: wait_healthy reports why


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch the server now if a collected test needs it (see the module docstring)."""
    global _early
    if session.config.option.collectonly or _early is not None:
        return
    if not any(SERVER_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        return
    python = _vllm_python_path()
    if not python.is_file():
        return  # the fixture fails the tests that need it, naming the missing venv
    _early = _launch(python, Path(tempfile.mkdtemp(prefix="rollvault-vllm-")))
    _set_niceness(_early.server, EARLY_NICENESS)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the early server even when no test used it (``-x`` ended the session first)."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.server.stop()
        shutil.rmtree(early.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model the server serves (built offline, seed 0)."""
    if _early is not None:
        return _early.model_dir
    return ensure_model_dir(tmp_path_factory.mktemp("vllm") / "model", build_default=True, seed=0)


@pytest.fixture(scope="session")
def vllm_server(
    vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedServer]:
    """A running vLLM server on the tiny model (a fault test may kill and restart it)."""
    if _early is not None:
        server = _early.server
        _set_niceness(server, 0)  # the vLLM tests wait on it now
    else:
        directory = tmp_path_factory.mktemp("vllm_server")
        server = _start_server(vllm_test_python(), vllm_model_dir, directory)
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
