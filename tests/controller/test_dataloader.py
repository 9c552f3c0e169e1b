"""Dataloader: each index once per epoch, seeded permutations, exact resume from a state."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.controller.data.dataloader import (
    DataLoaderState,
    DataLoaderStateError,
    PromptDataLoader,
    epoch_permutation,
)
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset


def loader(num_prompts: int, *, shuffle: bool = True, seed: int = 0) -> PromptDataLoader:
    dataset = SyntheticPromptDataset(num_prompts, prompt_tokens=2, vocab_size=16, seed=0)
    return PromptDataLoader(dataset, shuffle=shuffle, seed=seed)


def draw(source: PromptDataLoader, count: int) -> list[tuple[int, int]]:
    return [source.next_index() for _ in range(count)]


@settings(max_examples=60, deadline=None)
@given(
    num_prompts=st.integers(1, 40),
    epochs=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_each_index_exactly_once_per_epoch(
    num_prompts: int, epochs: int, shuffle: bool, seed: int
) -> None:
    source = loader(num_prompts, shuffle=shuffle, seed=seed)
    drawn = draw(source, num_prompts * epochs)
    for epoch in range(epochs):
        chunk = drawn[epoch * num_prompts : (epoch + 1) * num_prompts]
        assert {e for e, _ in chunk} == {epoch}
        assert sorted(idx for _, idx in chunk) == list(range(num_prompts))


@settings(max_examples=60, deadline=None)
@given(
    num_prompts=st.integers(1, 30),
    before=st.integers(0, 90),
    after=st.integers(1, 60),
    seed=st.integers(0, 2**32),
)
def test_resume_from_state_mid_epoch_continues_identically(
    num_prompts: int, before: int, after: int, seed: int
) -> None:
    original = loader(num_prompts, seed=seed)
    draw(original, before)
    encoded = msgspec.json.encode(original.state_dict())
    expected = draw(original, after)

    resumed = loader(num_prompts, seed=seed)
    resumed.load_state_dict(msgspec.json.decode(encoded, type=DataLoaderState))
    assert draw(resumed, after) == expected


def test_unshuffled_order_is_dataset_order() -> None:
    assert draw(loader(4, shuffle=False), 6) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_shuffled_epochs_differ_and_depend_on_seed() -> None:
    source = loader(50, seed=1)
    first = [idx for _, idx in draw(source, 50)]
    second = [idx for _, idx in draw(source, 50)]
    assert first != second
    assert first != list(range(50))
    other_seed = [idx for _, idx in draw(loader(50, seed=2), 50)]
    assert first != other_seed


def test_permutation_is_a_pure_function() -> None:
    assert epoch_permutation(30, seed=4, epoch=2) == epoch_permutation(30, seed=4, epoch=2)
    assert sorted(epoch_permutation(30, seed=4, epoch=2)) == list(range(30))


def test_cursor_reports_epoch_and_position() -> None:
    source = loader(3)
    assert source.state_dict() == DataLoaderState(epoch=0, position=0)
    draw(source, 3)
    # The last draw of an epoch leaves the cursor at its end, not in the next epoch.
    assert (source.epoch, source.position) == (0, 3)
    draw(source, 1)
    assert (source.epoch, source.position) == (1, 1)


@pytest.mark.parametrize(
    ("draws", "max_epochs", "expected"),
    [(0, 1, False), (2, 1, False), (3, 1, True), (3, 2, False), (6, 2, True), (0, 0, True)],
)
def test_exhausted(draws: int, max_epochs: int, expected: bool) -> None:
    source = loader(3)
    draw(source, draws)
    assert source.exhausted(max_epochs) is expected


def test_state_dict_is_a_snapshot_not_a_view() -> None:
    source = loader(5)
    state = source.state_dict()
    draw(source, 2)
    assert state == DataLoaderState(epoch=0, position=0)


@pytest.mark.parametrize(
    "state", [DataLoaderState(epoch=0, position=6), DataLoaderState(epoch=0, position=-1)]
)
def test_state_that_does_not_fit_is_rejected_without_change(state: DataLoaderState) -> None:
    source = loader(5)
    draw(source, 2)
    with pytest.raises(DataLoaderStateError, match="does not fit a dataset of 5 prompts"):
        source.load_state_dict(state)
    assert source.state_dict() == DataLoaderState(epoch=0, position=2)


def test_state_at_end_of_epoch_resumes_in_next_epoch() -> None:
    source = loader(4, shuffle=False)
    source.load_state_dict(DataLoaderState(epoch=2, position=4))
    assert source.next_index() == (3, 0)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"epoch": -1, "position": 0}', "$.epoch"),
        (b'{"epoch": 0, "position": "3"}', "$.position"),
        (b'{"epoch": 0, "position": 0, "extra": 1}', "extra"),
        (b'{"epoch": 0}', "position"),
    ],
)
def test_decoding_a_bad_state_names_the_field(raw: bytes, path: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=path.replace("$", r"\$")):
        msgspec.json.decode(raw, type=DataLoaderState)


def test_empty_dataset_is_rejected() -> None:
    class Empty:
        def __len__(self) -> int:
            return 0

        def __getitem__(self, idx: int) -> DatumSpec:
            raise IndexError(idx)

        def identity(self, idx: int) -> str:
            raise IndexError(idx)

    with pytest.raises(ValueError, match="at least one prompt"):
        PromptDataLoader(Empty(), shuffle=True, seed=0)
