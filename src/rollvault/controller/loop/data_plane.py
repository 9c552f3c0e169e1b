"""The run's data plane, chosen by ``dataplane.kind``, and the services it needs.

The embedded store needs nothing. The TransferQueue store needs TransferQueue
running (and Ray): :func:`data_plane_services` starts it for the run and stops
it at the end. It is imported only when chosen, so the ``[tq]`` extra is
optional.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rollvault.config.schema import DataPlaneConfig, DataPlaneKind
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.errors import DataPlaneStartError
from rollvault.dataplane.interface import DataPlane


def build_data_plane(config: DataPlaneConfig, cut: DataPlaneMutationCut) -> DataPlane:
    """An empty store of ``config.kind`` on ``cut`` (TransferQueue must be running for it)."""
    if config.kind is DataPlaneKind.TRANSFER_QUEUE:
        from rollvault.dataplane.tq.store import TransferQueueDataPlane

        return TransferQueueDataPlane(cut)
    return EmbeddedDataPlane(cut)


@contextlib.contextmanager
def data_plane_services(config: DataPlaneConfig) -> Iterator[None]:
    """Run what the store of ``config.kind`` needs (TransferQueue, and Ray if none runs)."""
    if config.kind is not DataPlaneKind.TRANSFER_QUEUE:
        yield
        return
    try:
        from rollvault.dataplane.tq.session import TransferQueueSettings, start_transfer_queue
    except ImportError as exc:
        raise DataPlaneStartError(
            f"dataplane.kind=transfer_queue needs the tq extra (pip install -e '.[tq]'): {exc}"
        ) from exc
    settings = config.transfer_queue
    session = start_transfer_queue(
        TransferQueueSettings(
            num_storage_units=settings.num_storage_units,
            init_timeout_s=settings.init_timeout_s,
            ray_num_cpus=settings.ray_num_cpus,
        )
    )
    try:
        yield
    finally:
        session.close()
