"""Shared helpers for data-plane tests (no pytest-asyncio: scenarios use asyncio.run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import EmbeddedDataPlane, Row

if TYPE_CHECKING:
    from rollvault.dataplane.tq import TransferQueueDataPlane

    Plane: TypeAlias = EmbeddedDataPlane | TransferQueueDataPlane
else:
    Plane: TypeAlias = EmbeddedDataPlane

PlaneFactory = Callable[[DataPlaneMutationCut], "Plane"]
"""Makes an empty store on a cut: the contract suite runs once per kind of store."""


def sample_row(seed: int, length: int = 6) -> Row:
    """A row shaped like a canonical training row, distinct per ``seed``."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 50_000, length, dtype=np.int64),
        "generation_logprobs": rng.standard_normal(length).astype(np.float32),
        "token_mask": rng.integers(0, 2, length).astype(bool),
        "reward": float(seed) / 4,
        "length": length,
        "truncated": bool(seed % 2),
    }


def assert_rows_identical(actual: Row, expected: Row) -> None:
    """Same fields; arrays with the same dtype, shape and bytes; scalars of the same type and value."""
    assert actual.keys() == expected.keys()
    for field, want in expected.items():
        got = actual[field]
        if isinstance(want, np.ndarray):
            assert isinstance(got, np.ndarray), field
            assert got.dtype == want.dtype, field
            assert got.shape == want.shape, field
            assert got.tobytes() == want.tobytes(), field
        else:
            assert type(got) is type(want), field
            if isinstance(want, float):
                assert isinstance(got, float)
                assert got.hex() == want.hex(), field
            else:
                assert got == want, field
