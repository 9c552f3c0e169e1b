"""Partition names and the staging/train key helpers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollvault.dataplane import (
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneValidationError,
    StagingKey,
    parse_staging_key,
    staging_key,
    train_key,
)


def test_partition_names_match_the_design() -> None:
    assert (STAGING_PARTITION, TRAIN_PARTITION) == ("rollout_staging", "train")


def test_staging_key_format_and_parse() -> None:
    key = staging_key("g7_g2_a0f3e", 12)
    assert key == "g7_g2_a0f3e/12"
    assert parse_staging_key(key) == StagingKey("g7_g2_a0f3e", 12)


@given(
    gate_rollout_id=st.text(min_size=1).filter(lambda text: "/" not in text),
    call_index=st.integers(0, 10**12),
)
def test_parse_inverts_format(gate_rollout_id: str, call_index: int) -> None:
    assert parse_staging_key(staging_key(gate_rollout_id, call_index)) == (
        gate_rollout_id,
        call_index,
    )


@pytest.mark.parametrize(
    ("gate_rollout_id", "call_index"),
    [("", 0), ("a/b", 0), ("g", -1), ("g", True), ("g", 1.0)],
)
def test_staging_key_rejects_bad_parts(gate_rollout_id: str, call_index: int) -> None:
    with pytest.raises(DataPlaneValidationError):
        staging_key(gate_rollout_id, call_index)


@pytest.mark.parametrize("key", ["g", "g/", "/0", "a/b/0", "g/01", "g/-1", "g/+1", "g/1x", "g/ 1"])
def test_parse_staging_key_rejects_what_staging_key_cannot_produce(key: str) -> None:
    with pytest.raises(DataPlaneValidationError, match="not a staging key"):
        parse_staging_key(key)


def test_train_key_is_the_sibling_logical_rollout_id() -> None:
    assert train_key("g7", 3) == "g7_g3"
    with pytest.raises(DataPlaneValidationError, match="generation index of group 'g7'"):
        train_key("g7", -1)
    with pytest.raises(DataPlaneValidationError, match="group id"):
        train_key("", 0)
