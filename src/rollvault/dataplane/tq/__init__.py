"""The TransferQueue data plane (``dataplane.kind: transfer_queue``, the ``[tq]`` extra).

Importing this package imports ``transfer_queue`` (and with it torch and
tensordict); the rest of :mod:`rollvault.dataplane` does not.
"""

from rollvault.dataplane.tq.capture import TransferQueueCapture
from rollvault.dataplane.tq.session import (
    TransferQueueSession,
    TransferQueueSettings,
    TransferQueueStartError,
    start_transfer_queue,
)
from rollvault.dataplane.tq.store import TransferQueueDataPlane

__all__ = [
    "TransferQueueCapture",
    "TransferQueueDataPlane",
    "TransferQueueSession",
    "TransferQueueSettings",
    "TransferQueueStartError",
    "start_transfer_queue",
]
