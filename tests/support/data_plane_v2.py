"""Writing a data-plane index as version 2 lists it, for the tests of reading old snapshots."""

from __future__ import annotations

from pathlib import Path

import msgspec

from rollvault.dataplane.checkpoint_format import (
    METADATA_FILENAME,
    SEGMENTED_V2_SCHEMA_VERSION,
    encode_envelope,
)
from rollvault.dataplane.segmented import (
    SegmentedCheckpointContent,
    SegmentReference,
    encode_live_bitmap,
    read_segmented_content,
)


def index_as_version_2(directory: Path) -> Path:
    """Rewrite the ``metadata.json`` in ``directory`` (a data-plane checkpoint directory) as
    version 2 lists the same index: each segment an object (file name, hex digest, base64
    bitmap), as the writer before version 3 wrote it. Returns the file's path."""
    index = read_segmented_content(directory)
    content = SegmentedCheckpointContent(
        partitions=index.partitions,
        segments=[
            SegmentReference(
                file=held.file,
                partition=held.partition,
                sha256=held.sha256,
                byte_size=held.byte_size,
                row_count=held.row_count,
                live_rows=held.live_rows,
                live=encode_live_bitmap(
                    held.row_count, [ordinal for ordinal, kept in enumerate(held.wanted) if kept]
                ),
            )
            for held in index.segments
        ],
        user_metadata=index.user_metadata,
    )
    path = directory / METADATA_FILENAME
    path.write_bytes(encode_envelope(msgspec.json.encode(content), SEGMENTED_V2_SCHEMA_VERSION))
    return path
