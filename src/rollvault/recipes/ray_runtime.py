"""Ray for one run: a private local Ray started and stopped with it, or a cluster joined.

``ray.address: local`` starts a private Ray for the run with its own temp dir,
``<ray.temp_root>/rvray_<hash of the checkpoint dir>`` (short: Ray's socket
paths must stay under 107 characters; derived from the run, so a restart of
the same run finds it), and shuts it down at the end. A driver that was
SIGKILLed could not shut its Ray down: its GCS server, raylet and workers
live on. The next start of the same run (it holds the run lock, so that
driver is gone) first kills exactly those processes, found by the marker
its Ray inherited (:mod:`rollvault.recipes.ray_processes`), and the old
session files, then starts a fresh Ray. ``owner.json`` in the temp dir names
the driver that started the Ray there and the processes Ray started for it; a
start refuses to touch a Ray whose driver is still running.

``ray.address: auto`` (the cluster of ``ray start --head`` on this machine)
or ``ray://host:port`` joins a cluster the user runs: the run only
disconnects at its end and never kills anything of it.

Ray is imported only here, in the Ray gate and trainer and in the
TransferQueue data plane: a run that does not use Ray never imports it. With
``dataplane.kind: transfer_queue`` this Ray (with its clean-up after a kill)
is the one TransferQueue starts on; the data plane starts a Ray of its own
only when a pipeline runs outside ``rollvault run`` (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from rollvault.config.errors import ConfigError
from rollvault.config.schema import DataPlaneKind, GateKind, RunConfig, TrainerPlacement
from rollvault.durable.fsync import atomic_write_bytes
from rollvault.recipes.ray_processes import (
    MARKER_ENV,
    ProcessId,
    descendants,
    process_start_time,
    reap,
)

__all__ = [
    "LOCAL_ADDRESS",
    "RayInUseError",
    "RaySession",
    "private_temp_dir",
    "ray_runtime",
    "uses_ray",
]

LOCAL_ADDRESS: Final = "local"
OWNER_FILENAME: Final = "owner.json"
_MAX_TEMP_DIR_CHARS: Final = 40
"""Ray appends ``/session_<date>_<time>_<pid>/sockets/plasma_store`` and more: about 65."""


class RayInUseError(ConfigError):
    """The run's private Ray belongs to a driver that is still running."""


class _Owner(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Who started the private Ray in a temp dir, and the processes Ray started for it."""

    pid: int
    start_time: int | None
    ray_processes: list[ProcessId] = msgspec.field(default_factory=list)


@dataclass
class RaySession:
    """The Ray this run uses, and what stopping it means."""

    address: str
    temp_dir: Path | None
    """The private Ray's temp dir; None when joining a cluster."""
    reaped: list[int]
    """Pids of a dead driver's Ray this start killed before starting its own."""

    @property
    def private(self) -> bool:
        return self.temp_dir is not None


def uses_ray(config: RunConfig) -> bool:
    """Whether ``config`` needs Ray (the Ray gate, the trainer as an actor, TransferQueue)."""
    return (
        config.gate.kind is GateKind.RAY
        or config.trainer.placement is TrainerPlacement.RAY
        or config.dataplane.kind is DataPlaneKind.TRANSFER_QUEUE
    )


def _private_num_cpus(config: RunConfig) -> int | None:
    """Logical CPUs of the private Ray: ``ray.num_cpus``, else the machine's plus TQ's actors.

    TransferQueue's controller and each storage unit take one Ray CPU for
    their lifetime; without room for them ``transfer_queue.init`` hangs.
    """
    if config.ray.num_cpus is not None:
        return config.ray.num_cpus
    if config.dataplane.kind is not DataPlaneKind.TRANSFER_QUEUE:
        return None
    return (os.cpu_count() or 1) + 1 + config.dataplane.transfer_queue.num_storage_units


def private_temp_dir(config: RunConfig) -> Path:
    """The private Ray's temp dir of this run: short, and the same for every start."""
    run = str(Path(config.checkpointing.checkpoint_dir).resolve())
    digest = hashlib.sha256(run.encode()).hexdigest()[:12]
    path = Path(config.ray.temp_root) / f"rvray_{digest}"
    if not path.is_absolute() or len(str(path)) > _MAX_TEMP_DIR_CHARS:
        raise ConfigError(
            f"ray.temp_root={config.ray.temp_root!r} gives the Ray temp dir {path}: it must be "
            f"absolute and at most {_MAX_TEMP_DIR_CHARS} characters (Ray's socket paths "
            "are limited to 107)"
        )
    return path


@contextlib.contextmanager
def ray_runtime(config: RunConfig) -> Iterator[RaySession | None]:
    """Ray for the run inside the block (None: the run does not use Ray)."""
    if not uses_ray(config):
        yield None
        return
    session = _start(config)
    try:
        yield session
    finally:
        _stop(session)


def _start(config: RunConfig) -> RaySession:
    import ray

    address = config.ray.address
    if address != LOCAL_ADDRESS:
        ray.init(address=address, log_to_driver=False)
        return RaySession(address=address, temp_dir=None, reaped=[])
    temp_dir = private_temp_dir(config)
    reaped = _clear_dead_drivers_ray(temp_dir)
    if reaped:
        print(
            f"rollvault: killed {len(reaped)} processes of the private Ray a killed start "
            f"left in {temp_dir}",
            file=sys.stderr,
        )
    temp_dir.mkdir(parents=True, exist_ok=True)
    _write_owner(temp_dir, [])
    # Inherited by Ray's processes (not by this driver's other children: it is
    # removed again once Ray has started), so a later start can find them.
    previous = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = str(temp_dir)
    # The driver's children so far are not Ray's: multiprocessing's resource tracker,
    # a process the caller started. Recorded as Ray's, the stop would kill them.
    others = set(descendants(os.getpid()))
    try:
        ray.init(
            address=LOCAL_ADDRESS,
            _temp_dir=str(temp_dir),
            num_cpus=_private_num_cpus(config),
            include_dashboard=False,
            log_to_driver=False,
        )
    finally:
        _restore_env(previous)
    # What descends from the driver now and did not before ray.init is Ray's.
    _write_owner(temp_dir, [p for p in descendants(os.getpid()) if p not in others])
    return RaySession(address=LOCAL_ADDRESS, temp_dir=temp_dir, reaped=reaped)


def _stop(session: RaySession) -> None:
    import ray

    ray.shutdown()
    if session.temp_dir is not None:
        # ray.shutdown stops what it started; a process that outlived it (a worker
        # still exiting) is killed, so the run leaves nothing behind.
        reap(str(session.temp_dir), _read_owner(session.temp_dir / OWNER_FILENAME).ray_processes)
        (session.temp_dir / OWNER_FILENAME).unlink(missing_ok=True)


def _clear_dead_drivers_ray(temp_dir: Path) -> list[int]:
    """Kill the Ray a dead driver of this run left in ``temp_dir``; drop its session files."""
    owner_path = temp_dir / OWNER_FILENAME
    recorded: list[ProcessId] = []
    if owner_path.is_file():
        owner = _read_owner(owner_path)
        alive = owner.pid != os.getpid() and process_start_time(owner.pid) == owner.start_time
        if alive and owner.start_time is not None:
            raise RayInUseError(
                f"the private Ray in {temp_dir} belongs to driver pid {owner.pid}, which is "
                "still running (another start of this run?)"
            )
        recorded = owner.ray_processes
    reaped = reap(str(temp_dir), recorded)
    for session in temp_dir.glob("session_*"):
        if session.is_symlink():
            session.unlink()
        elif session.is_dir():
            # Logs and sockets of the dead session: what cannot be removed costs disk only.
            shutil.rmtree(session, ignore_errors=True)
    return reaped


def _write_owner(temp_dir: Path, ray_processes: list[ProcessId]) -> None:
    owner = _Owner(
        pid=os.getpid(), start_time=process_start_time(os.getpid()), ray_processes=ray_processes
    )
    atomic_write_bytes(temp_dir / OWNER_FILENAME, msgspec.json.encode(owner))


def _read_owner(path: Path) -> _Owner:
    try:
        return msgspec.json.decode(path.read_bytes(), type=_Owner)
    except FileNotFoundError:
        return _Owner(pid=-1, start_time=None)
    except msgspec.DecodeError as error:
        raise ConfigError(f"{path}: not a Ray owner record ({error})") from error


def _restore_env(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(MARKER_ENV, None)
    else:
        os.environ[MARKER_ENV] = previous
