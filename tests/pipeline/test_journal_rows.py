"""A batch's rows in columns: packing gives back exactly the rows encode_row stores."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.controller.loop.journal_rows import (
    ArrayColumn,
    RowBlock,
    SealJournalRecordError,
    ValueColumn,
    encode_row,
    pack_rows,
    unpack_rows,
)

_DTYPES = [np.int64, np.int32, np.int8, np.float32, np.float64, np.bool_]


def _turn_row(length: int, *, correct: bool | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "input_ids": np.arange(length, dtype=np.int64),
        "generation_logprobs": np.linspace(-1.0, 0.0, length, dtype=np.float32),
        "token_mask": np.ones(length, dtype=np.int8),
        "prompt_length": 2,
        "done": True,
        "reward": 0.5,
    }
    if correct is not None:
        row["correct"] = correct
    return row


def _round_trip(rows: list[dict[str, Any]]) -> list[Any]:
    # Through msgpack, as the journal stores them.
    blocks = pack_rows(rows)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(blocks), type=list[RowBlock])
    return unpack_rows(decoded, len(rows), where="test")


def test_rows_with_the_same_fields_are_one_block_of_stacked_arrays() -> None:
    rows = [_turn_row(length) for length in (3, 0, 5)]
    (block,) = pack_rows(rows)
    assert block.positions == [0, 1, 2]
    ids = block.columns["input_ids"]
    assert isinstance(ids, ArrayColumn) and ids.lengths == [3, 0, 5]
    assert ids.data == np.concatenate([row["input_ids"] for row in rows]).tobytes()
    assert block.columns["reward"] == ValueColumn(values=[0.5, 0.5, 0.5])
    assert _round_trip(rows) == [encode_row(row) for row in rows]


def test_rows_with_other_fields_go_in_blocks_of_their_own_and_keep_their_order() -> None:
    rows = [_turn_row(2), _turn_row(3, correct=True), _turn_row(4), _turn_row(1, correct=False)]
    blocks = pack_rows(rows)
    assert [block.positions for block in blocks] == [[0, 2], [1, 3]]
    assert _round_trip(rows) == [encode_row(row) for row in rows]


def test_arrays_that_do_not_stack_and_numpy_scalars_are_kept_row_by_row() -> None:
    rows = [_turn_row(3), _turn_row(2)]
    rows[1]["input_ids"] = rows[1]["input_ids"].astype(np.int32)  # another dtype
    rows[0]["reward"] = np.float32(0.25)  # a gate's own row may hold numpy scalars
    rows[1]["token_mask"] = rows[1]["token_mask"].astype(">i1")  # not native: still fine
    (block,) = pack_rows(rows)
    assert isinstance(block.columns["input_ids"], ValueColumn)
    assert isinstance(block.columns["reward"], ValueColumn)
    assert _round_trip(rows) == [encode_row(row) for row in rows]


@pytest.mark.parametrize(
    "arrays",
    [
        [np.zeros((2, 2), dtype=np.int64), np.zeros((1, 2), dtype=np.int64)],  # all 2-D
        [np.arange(3, dtype=np.int64), np.zeros((1, 3), dtype=np.int64)],  # 1-D and 2-D
        [np.array(1, dtype=np.int64), np.array(2, dtype=np.int64)],  # zero-dimensional
    ],
    ids=["two-dimensional", "mixed-dimensions", "zero-dimensional"],
)
def test_arrays_that_are_not_all_one_dimensional_are_kept_row_by_row(
    arrays: list[np.ndarray],
) -> None:
    rows: list[dict[str, Any]] = [{"x": a, "n": number} for number, a in enumerate(arrays)]
    (block,) = pack_rows(rows)
    column = block.columns["x"]
    assert isinstance(column, ValueColumn)
    assert column.values == [encode_row(row)["x"] for row in rows]
    assert block.columns["n"] == ValueColumn(values=[0, 1])


def test_rows_that_are_mappings_but_not_dicts_pack_alike() -> None:
    rows = [_turn_row(length) for length in (2, 4)]
    views = [MappingProxyType(row) for row in rows]
    assert pack_rows(views) == pack_rows(rows)
    assert _round_trip(views) == [encode_row(row) for row in rows]  # type: ignore[arg-type]


def test_big_endian_arrays_are_stored_little_endian() -> None:
    rows = [{"x": np.arange(3, dtype=">i8")}, {"x": np.arange(2, dtype=">i8")}]
    (block,) = pack_rows(rows)
    column = block.columns["x"]
    assert isinstance(column, ArrayColumn)
    assert column.data == np.array([0, 1, 2, 0, 1], dtype="<i8").tobytes()
    assert _round_trip(rows) == [encode_row(row) for row in rows]


def test_a_column_that_does_not_fit_its_rows_is_refused_by_name() -> None:
    (block,) = pack_rows([_turn_row(3), _turn_row(2)])
    ids = block.columns["input_ids"]
    assert isinstance(ids, ArrayColumn)
    short = msgspec.structs.replace(ids, lengths=[3, 3])
    bad = msgspec.structs.replace(block, columns={**block.columns, "input_ids": short})
    with pytest.raises(SealJournalRecordError, match=r"here, row block 0, field 'input_ids'"):
        unpack_rows([bad], 2, where="here")
    few = msgspec.structs.replace(
        block, columns={**block.columns, "done": ValueColumn(values=[True])}
    )
    with pytest.raises(SealJournalRecordError, match=r"field 'done': 1 values for 2 rows"):
        unpack_rows([few], 2, where="here")


def test_positions_out_of_range_taken_twice_or_missing_are_refused() -> None:
    (block,) = pack_rows([_turn_row(1), _turn_row(1)])
    with pytest.raises(SealJournalRecordError, match="out of range or taken twice"):
        unpack_rows([block, block], 4, where="here")
    with pytest.raises(SealJournalRecordError, match="out of range or taken twice"):
        unpack_rows([block], 1, where="here")
    with pytest.raises(SealJournalRecordError, match=r"no row block holds rows \[2, 3\]"):
        unpack_rows([block], 4, where="here")


_VALUES = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.builds(
        lambda dtype, length: np.arange(length).astype(dtype),
        st.sampled_from(_DTYPES),
        st.integers(min_value=0, max_value=6),
    ),
)
_ROWS = st.lists(
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _VALUES, min_size=1, max_size=4),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(_ROWS)
def test_any_rows_round_trip_to_what_encode_row_stores(rows: list[dict[str, Any]]) -> None:
    assert _round_trip(rows) == [encode_row(row) for row in rows]
