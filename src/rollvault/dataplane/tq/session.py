"""Starting and stopping TransferQueue (and, when nobody else did, a private local Ray).

TransferQueue keeps one controller actor and ``num_storage_units`` storage
actors per Ray cluster, and one client per process (module state of
``transfer_queue``). :func:`start_transfer_queue` brings all of that up with a
timeout, because on a small machine ``transfer_queue.init`` does not fail, it
hangs: its controller and each storage unit ask Ray for one CPU each, and
with too few logical CPUs the last actor is never scheduled.

Ray itself: an already initialized Ray (a recipe that started it, or joined
a cluster) is used as it is and left running; otherwise a private local Ray
is started with ``address="local"`` and its own temporary directory, and
stopped again by :meth:`TransferQueueSession.close`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

# TransferQueue logs a warning per storage request on machines with fewer cores
# than its default thread count; its loggers read this when first imported,
# here and in the actors (which inherit the environment of the local Ray).
os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")

import ray  # noqa: E402
import transfer_queue  # noqa: E402

from rollvault.dataplane.errors import DataPlaneStartError  # noqa: E402

TQ_ACTOR_CPUS = 1
"""Ray CPUs each TransferQueue actor (the controller, every storage unit) asks for."""


class TransferQueueStartError(DataPlaneStartError):
    """TransferQueue could not be started (timeout, or Ray refused)."""


@dataclass(frozen=True, kw_only=True)
class TransferQueueSettings:
    """How to bring TransferQueue up; mirrors ``dataplane.transfer_queue`` in the config."""

    num_storage_units: int = 1
    init_timeout_s: float = 120.0
    ray_num_cpus: int | None = None
    """Logical CPUs of a private local Ray; None: enough for TransferQueue's actors plus 2."""
    ray_temp_dir: Path | None = None
    """Temporary directory of a private local Ray; None: a fresh short one under /tmp."""

    def needed_cpus(self) -> int:
        """Ray CPUs TransferQueue's actors take: the controller and each storage unit."""
        return TQ_ACTOR_CPUS * (1 + self.num_storage_units)


class TransferQueueSession:
    """A running TransferQueue; :meth:`close` stops it and any Ray it started."""

    def __init__(self, *, owns_ray: bool, ray_temp_dir: Path | None) -> None:
        self._owns_ray = owns_ray
        self._ray_temp_dir = ray_temp_dir
        self._closed = False

    @property
    def owns_ray(self) -> bool:
        """Whether this session started the Ray it runs on (and will stop it)."""
        return self._owns_ray

    def close(self) -> None:
        """Stop TransferQueue's actors and client, then the private Ray, if any. Idempotent."""
        if self._closed:
            return
        self._closed = True
        transfer_queue.close()
        if self._owns_ray:
            ray.shutdown()
            if self._ray_temp_dir is not None:
                # Session logs and sockets of a Ray nobody else uses.
                shutil.rmtree(self._ray_temp_dir, ignore_errors=True)


def start_transfer_queue(settings: TransferQueueSettings) -> TransferQueueSession:
    """Start TransferQueue on the current Ray, starting a private local Ray if there is none.

    Raises :class:`TransferQueueStartError` if ``transfer_queue.init`` does
    not finish within ``init_timeout_s``, naming the CPUs Ray has and the
    CPUs TransferQueue's actors need; a Ray started here is stopped again.
    """
    owns_ray = not ray.is_initialized()
    temp_dir: Path | None = None
    if owns_ray:
        temp_dir = settings.ray_temp_dir or Path(tempfile.mkdtemp(prefix="rv-ray-", dir="/tmp"))
        num_cpus = settings.ray_num_cpus or settings.needed_cpus() + 2
        ray.init(
            address="local",
            _temp_dir=str(temp_dir),
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    session = TransferQueueSession(owns_ray=owns_ray, ray_temp_dir=temp_dir)
    try:
        _init_with_timeout(settings)
    except BaseException:
        session.close()
        raise
    return session


def _init_with_timeout(settings: TransferQueueSettings) -> None:
    conf = {"backend": {"SimpleStorage": {"num_data_storage_units": settings.num_storage_units}}}
    failure: list[BaseException] = []

    def init() -> None:
        try:
            transfer_queue.init(conf)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            failure.append(exc)

    # A daemon thread: a hung init must not keep the process alive at exit.
    thread = threading.Thread(target=init, name="transfer-queue-init", daemon=True)
    thread.start()
    thread.join(settings.init_timeout_s)
    if thread.is_alive():
        cpus = ray.cluster_resources().get("CPU", 0)
        raise TransferQueueStartError(
            f"transfer_queue.init did not finish within {settings.init_timeout_s:g} s "
            f"(dataplane.transfer_queue.init_timeout_s). Ray has {cpus:g} logical CPUs; "
            f"TransferQueue's controller and its {settings.num_storage_units} storage unit(s) "
            f"need {settings.needed_cpus()} of them, beside any other actors: use fewer "
            "storage units (dataplane.transfer_queue.num_storage_units) or give Ray more "
            "logical CPUs (dataplane.transfer_queue.ray_num_cpus, or num_cpus of the Ray "
            "you started)"
        )
    if failure:
        raise TransferQueueStartError(f"transfer_queue.init failed: {failure[0]}") from failure[0]
