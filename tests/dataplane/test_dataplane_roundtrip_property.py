"""Property, for every store: any valid set of rows survives save and load exactly."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import dataplane_stores
import numpy as np
from dataplane_helpers import Plane, PlaneFactory, assert_rows_identical
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import Row, RowDtype

make_plane = dataplane_stores.make_plane  # the fixture: every test runs on every store

names = st.text(min_size=1, max_size=6)
partition_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}", fullmatch=True)

arrays = st.sampled_from([np.dtype(dtype.value) for dtype in RowDtype]).flatmap(
    lambda dtype: hnp.arrays(dtype, st.integers(0, 5))
)
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
rows = st.dictionaries(names, st.one_of(arrays, scalars), max_size=5)
partitions = st.dictionaries(
    partition_names, st.dictionaries(names, rows, max_size=4), min_size=1, max_size=3
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
user_metadata = st.dictionaries(st.text(max_size=5), json_values, max_size=3)


async def round_trip(
    make_plane: PlaneFactory,
    content: dict[str, dict[str, Row]],
    metadata: dict[str, Any],
    directory: Path,
) -> tuple[Plane, dict[str, Any]]:
    source = make_plane(DataPlaneMutationCut())
    for partition, partition_rows in content.items():
        await source.put(partition, partition_rows)
    await source.save_checkpoint(directory, metadata)
    target = make_plane(DataPlaneMutationCut())
    return target, await target.load_checkpoint(directory)


# ``make_plane`` is a constructor, the same for every example.
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=partitions, metadata=user_metadata)
def test_any_rows_round_trip_exactly(
    make_plane: PlaneFactory, content: dict[str, dict[str, Row]], metadata: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        target, loaded_metadata = asyncio.run(
            round_trip(make_plane, content, metadata, Path(scratch) / "data_plane")
        )
        assert loaded_metadata == metadata
        assert target.partitions() == sorted(content)
        for partition, partition_rows in content.items():
            assert target.keys(partition) == sorted(partition_rows)
            loaded = asyncio.run(target.get(partition, sorted(partition_rows)))
            for key, row in partition_rows.items():
                assert_rows_identical(loaded[key], row)
