"""The data-plane contract runs against every store: embedded and TransferQueue.

``make_plane`` is parametrized over both; test modules import it (a fixture
imported into a module is a fixture there; a ``conftest.py`` here would clash
with ``tests/ledger/conftest.py`` for mypy). TransferQueue needs Ray and its
own actors (15 to 45 s to start on 2 busy cores), so one TransferQueue serves
every test of the session: started by the first test that asks for it,
stopped after the last one (before tests elsewhere start a Ray of their own).
"""

from __future__ import annotations

import atexit
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dataplane_helpers import PlaneFactory

from rollvault.dataplane import EmbeddedDataPlane

if TYPE_CHECKING:
    from rollvault.dataplane.tq import TransferQueueSession

_running: list[TransferQueueSession] = []


def transfer_queue_session() -> TransferQueueSession:
    """The directory's TransferQueue on a private local Ray, started on first use."""
    from rollvault.dataplane.tq import TransferQueueSettings, start_transfer_queue

    if not _running:
        temp_dir = Path(tempfile.mkdtemp(prefix="rv-tq-", dir="/tmp"))
        _running.append(
            start_transfer_queue(
                TransferQueueSettings(
                    num_storage_units=1, init_timeout_s=240, ray_temp_dir=temp_dir
                )
            )
        )
    return _running[0]


def stop_transfer_queue() -> None:
    """Stop the directory's TransferQueue and its Ray, if running."""
    while _running:
        _running.pop().close()


@pytest.fixture
def fresh_transfer_queue(request: pytest.FixtureRequest) -> Iterator[None]:
    """A TransferQueue (and Ray) started anew for this test: nothing of earlier tests in it."""
    stop_transfer_queue()
    transfer_queue_session()
    _stop_after_the_last_user(request)
    yield


atexit.register(stop_transfer_queue)  # a session cut short (-x, ^C) leaves no Ray behind


def _uses_transfer_queue(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("make_plane") == "transfer_queue":
        return True
    fixtures = getattr(item, "fixturenames", ())
    return "fresh_transfer_queue" in fixtures or "restart_transfer_queue" in fixtures


def _stop_after_the_last_user(request: pytest.FixtureRequest) -> None:
    users = [item for item in request.session.items if _uses_transfer_queue(item)]
    if users and users[-1] is request.node:
        request.addfinalizer(stop_transfer_queue)


def _embedded() -> PlaneFactory:
    return EmbeddedDataPlane


def _transfer_queue() -> PlaneFactory:
    from rollvault.dataplane.tq import TransferQueueDataPlane

    transfer_queue_session()
    return TransferQueueDataPlane


STORES = {"embedded": _embedded, "transfer_queue": _transfer_queue}


@pytest.fixture(
    params=["embedded", pytest.param("transfer_queue", marks=pytest.mark.slow)],
)
def make_plane(request: pytest.FixtureRequest) -> PlaneFactory:
    """A constructor of empty stores (``make_plane(cut)``), once per kind of store."""
    if request.param == "transfer_queue":
        _stop_after_the_last_user(request)
    return STORES[request.param]()


@pytest.fixture
def restart_transfer_queue(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Ensures TransferQueue runs; calling the result stops it and starts a fresh one."""
    transfer_queue_session()
    _stop_after_the_last_user(request)

    def restart() -> None:
        stop_transfer_queue()
        transfer_queue_session()

    return restart
