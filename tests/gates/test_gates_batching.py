"""Where the local model gate cuts its queue into batches: at group boundaries."""

from __future__ import annotations

import pytest

from rollvault.gates.local_model import batch_size


@pytest.mark.parametrize(
    ("groups", "max_batch_size", "expected"),
    [
        ([], 4, 0),
        (["a", "a"], 4, 2),  # everything waiting fits
        (["a", "a", "b", "b"], 4, 4),  # the batch ends exactly at a boundary
        (["a", "a", "a", "b", "b", "b"], 4, 3),  # b would be split: it waits
        (["a", "b", "b", "b", "b"], 4, 1),
        (["a", "a", "a", "a", "a", "b"], 4, 4),  # a alone is larger than a batch
        (["a", "a", "a", "a", "b"], 4, 4),
        (["a", "b", "c"], 2, 2),
        (["a", "a"], 1, 1),
    ],
)
def test_a_batch_splits_no_group_that_does_not_start_it(
    groups: list[str], max_batch_size: int, expected: int
) -> None:
    assert batch_size(groups, max_batch_size) == expected
