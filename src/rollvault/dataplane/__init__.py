"""The data plane: bulk token rows by key inside named partitions.

Only keys and small metadata cross the controller; the recovery ledger never
holds tokens. :class:`EmbeddedDataPlane` is the in-process default backend.
"""

from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_format import (
    DATA_PLANE_SCHEMA_VERSION,
    METADATA_FILENAME,
    DataPlaneCheckpointContent,
    DataPlaneCheckpointInfo,
    check_user_metadata,
    decode_metadata,
    partition_file_name,
)
from rollvault.dataplane.checkpoint_io import (
    LoadedCheckpoint,
    read_checkpoint,
    read_checkpoint_metadata,
)
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.errors import (
    DataPlaneCheckpointError,
    DataPlaneConflictError,
    DataPlaneError,
    DataPlaneFieldError,
    DataPlaneKeyError,
    DataPlaneNotEmptyError,
    DataPlaneStartError,
    DataPlaneValidationError,
)
from rollvault.dataplane.interface import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlane,
    StagingKey,
    parse_staging_key,
    staging_key,
    train_key,
)
from rollvault.dataplane.rows import Row, RowDtype, RowInput, RowValue, RowView

__all__ = [
    "DATA_PLANE_SCHEMA_VERSION",
    "METADATA_FILENAME",
    "STAGING_PARTITION",
    "TRAIN_PARTITION",
    "DataPlane",
    "DataPlaneCapture",
    "DataPlaneCheckpointContent",
    "DataPlaneCheckpointError",
    "DataPlaneCheckpointInfo",
    "DataPlaneConflictError",
    "DataPlaneError",
    "DataPlaneFieldError",
    "DataPlaneKeyError",
    "DataPlaneNotEmptyError",
    "DataPlaneStartError",
    "DataPlaneValidationError",
    "EmbeddedDataPlane",
    "LoadedCheckpoint",
    "Row",
    "RowDtype",
    "RowInput",
    "RowValue",
    "RowView",
    "StagingKey",
    "check_user_metadata",
    "decode_metadata",
    "parse_staging_key",
    "partition_file_name",
    "read_checkpoint",
    "read_checkpoint_metadata",
    "staging_key",
    "train_key",
]
