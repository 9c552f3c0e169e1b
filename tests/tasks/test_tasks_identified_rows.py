"""``row_with_identity``: a generated task's row and its identity from one build."""

from __future__ import annotations

import pytest

from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.guess.dataset import GuessPromptDataset
from rollvault.tasks.protocols import (
    IdentifiedRows,
    PromptDataset,
    identified_row_fetcher,
    prompt_identity,
)
from rollvault.tasks.reverse.dataset import ReversePromptDataset
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset

DATASETS = [
    SyntheticPromptDataset(12, 8, 50, seed=3),
    AdditionPromptDataset(12, seed=3),
    ReversePromptDataset(12, seed=3),
    GuessPromptDataset(12, seed=3),
]


@pytest.mark.parametrize("dataset", DATASETS, ids=lambda d: type(d).__name__)
def test_row_with_identity_is_the_row_and_its_identity(dataset: PromptDataset) -> None:
    assert isinstance(dataset, IdentifiedRows)
    fetch = identified_row_fetcher(dataset)
    assert fetch == dataset.row_with_identity  # the one build, chosen
    for idx in range(len(dataset)):
        row, identity = fetch(idx)
        assert row == dataset[idx]
        assert identity == dataset.identity(idx) == prompt_identity(row)
    with pytest.raises(IndexError):
        fetch(len(dataset))


class Plain:
    """A user's dataset with only today's methods."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __len__(self) -> int:
        return 3

    def __getitem__(self, idx: int) -> DatumSpec:
        self.calls.append("row")
        return {"idx": idx, "prompt_text": f"p{idx}"}

    def identity(self, idx: int) -> str:
        self.calls.append("identity")
        return f"id{idx}"


def test_a_dataset_without_it_is_asked_identity_then_row() -> None:
    dataset = Plain()
    assert not isinstance(dataset, IdentifiedRows)
    assert identified_row_fetcher(dataset)(2) == ({"idx": 2, "prompt_text": "p2"}, "id2")
    assert dataset.calls == ["identity", "row"]


class OwnIdentity(SyntheticPromptDataset):
    def identity(self, idx: int) -> str:
        return f"mine {idx}"


class OwnRows(SyntheticPromptDataset):
    def __getitem__(self, idx: int) -> DatumSpec:
        return {**super().__getitem__(idx), "prompt_text": "changed"}


def test_a_subclass_overriding_identity_alone_is_asked_its_own() -> None:
    dataset = OwnIdentity(4, 8, 50, seed=3)
    row, identity = identified_row_fetcher(dataset)(1)
    assert (row, identity) == (dataset[1], "mine 1")


def test_a_subclass_overriding_rows_gets_their_identity() -> None:
    dataset = OwnRows(4, 8, 50, seed=3)
    row, identity = identified_row_fetcher(dataset)(1)
    assert row["prompt_text"] == "changed"
    assert identity == dataset.identity(1) == prompt_identity(row)


class CountedBuilds(SyntheticPromptDataset):
    """Counts the rows it builds and the identities it is asked."""

    def __init__(self) -> None:
        super().__init__(4, 8, 50, seed=3)
        self.calls: list[str] = []

    def __getitem__(self, idx: int) -> DatumSpec:
        self.calls.append("row")
        return super().__getitem__(idx)


class CountedIdentity(CountedBuilds):
    def identity(self, idx: int) -> str:
        self.calls.append("identity")
        return super().identity(idx)


class IdentityMixin:
    def identity(self, idx: int) -> str:
        return f"mixed {idx}"


class MixedIdentity(IdentityMixin, SyntheticPromptDataset):
    """``identity`` from a class ahead in the order, not from a subclass of the dataset."""


class DeeperIdentity(OwnIdentity):
    """Overrides nothing itself: its parent's ``identity`` is still not the digest's."""


def test_a_digest_dataset_builds_the_row_once_and_never_asks_identity() -> None:
    dataset = CountedBuilds()
    row, identity = identified_row_fetcher(dataset)(2)
    assert dataset.calls == ["row"]
    assert identity == prompt_identity(row)


def test_an_overridden_identity_is_asked_wherever_it_is_defined() -> None:
    counted = CountedIdentity()
    row, identity = identified_row_fetcher(counted)(2)
    # Its identity digests a second build of the row: the override was asked.
    assert counted.calls == ["row", "identity", "row"] and identity == prompt_identity(row)
    assert identified_row_fetcher(MixedIdentity(4, 8, 50, seed=3))(1)[1] == "mixed 1"
    assert identified_row_fetcher(DeeperIdentity(4, 8, 50, seed=3))(1)[1] == "mine 1"
