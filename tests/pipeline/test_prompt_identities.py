"""A snapshot names each group's prompt identity; the checkpointer hashes each group once."""

from __future__ import annotations

from rollvault.controller.loop.parts import GroupOrigin
from rollvault.controller.snapshots.checkpointer import PromptIdentities
from rollvault.tasks.addition.dataset import AdditionPromptDataset


class CountingDataset(AdditionPromptDataset):
    def __init__(self) -> None:
        super().__init__(20, seed=0)
        self.hashed: list[int] = []

    def identity(self, idx: int) -> str:
        self.hashed.append(idx)
        return super().identity(idx)


def origin(idx: int) -> GroupOrigin:
    return GroupOrigin(epoch=0, dataset_idx=idx)


def test_each_group_is_hashed_once_while_snapshots_hold_it() -> None:
    dataset = CountingDataset()
    reference = AdditionPromptDataset(20, seed=0)
    identities = PromptIdentities()
    first = identities.of(dataset, {"a": origin(1), "b": origin(2)})
    assert first == {"a": reference.identity(1), "b": reference.identity(2)}
    second = identities.of(dataset, {"b": origin(2), "c": origin(3)})
    assert second == {"b": reference.identity(2), "c": reference.identity(3)}
    assert dataset.hashed == [1, 2, 3]  # b was known
    # A group no snapshot held since is forgotten: the cache holds only live groups.
    assert identities.of(dataset, {"a": origin(1)}) == {"a": reference.identity(1)}
    assert dataset.hashed == [1, 2, 3, 1]
