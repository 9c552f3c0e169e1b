"""The next prompt: spares never cross an epoch boundary and drain at each epoch's end."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rollvault.controller.data.dataloader import DataLoaderState, PromptDataLoader
from rollvault.controller.data.prompt_source import next_prompt, refill_spares
from rollvault.controller.data.shortfall import SparePrompt, SparePrompts, SparePromptsState
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset


def loader(num_prompts: int) -> PromptDataLoader:
    dataset = SyntheticPromptDataset(num_prompts, prompt_tokens=2, vocab_size=16, seed=0)
    return PromptDataLoader(dataset, shuffle=True, seed=3)


def reserve_all(
    dataloader: PromptDataLoader, spares: SparePrompts, *, wanted: int, max_epochs: int
) -> list[tuple[int, int]]:
    """What the rollout pump reserves, in order, with no drop: take, then refill."""
    taken = []
    while (prompt := next_prompt(dataloader, spares, max_epochs=max_epochs)) is not None:
        taken.append(prompt)
        refill_spares(dataloader, spares, wanted=wanted, max_epochs=max_epochs)
        assert {epoch for epoch, _ in spares} <= {dataloader.epoch}, "a spare crossed an epoch"
    return taken


@settings(max_examples=40, deadline=None)
@given(num_prompts=st.integers(1, 9), wanted=st.integers(0, 12), max_epochs=st.integers(1, 4))
def test_each_epoch_is_reserved_whole_before_the_next_begins(
    num_prompts: int, wanted: int, max_epochs: int
) -> None:
    dataloader, spares = loader(num_prompts), SparePrompts()
    taken = reserve_all(dataloader, spares, wanted=wanted, max_epochs=max_epochs)
    epochs = [epoch for epoch, _ in taken]
    # Every prompt once per epoch, and the epochs in order: no spare trains late.
    assert epochs == sorted(epochs)
    assert Counter(taken) == Counter(
        (epoch, idx) for epoch in range(max_epochs) for idx in range(num_prompts)
    )
    assert len(spares) == 0


def test_spares_of_an_epoch_go_before_the_next_epochs_first_prompt() -> None:
    reference = loader(4)
    order = [reference.next_index() for _ in range(5)]  # epoch 0, then epoch 1's first
    dataloader, spares = loader(4), SparePrompts()
    assert next_prompt(dataloader, spares, max_epochs=3) == order[0]
    refill_spares(dataloader, spares, wanted=2, max_epochs=3)
    assert list(spares) == order[1:3]
    assert next_prompt(dataloader, spares, max_epochs=3) == order[3]  # epoch 0's last draw
    refill_spares(dataloader, spares, wanted=2, max_epochs=3)
    assert list(spares) == order[1:3], "refilled across the epoch boundary"
    assert [next_prompt(dataloader, spares, max_epochs=3) for _ in range(2)] == order[1:3]
    assert next_prompt(dataloader, spares, max_epochs=3) == order[4]
    refill_spares(dataloader, spares, wanted=2, max_epochs=3)
    assert [epoch for epoch, _ in spares] == [1, 1]


def test_a_restored_reserve_of_an_earlier_epoch_drains_first() -> None:
    # A snapshot of an older version: spares of epoch 0, the dataloader mid-epoch 1.
    dataloader, spares = loader(5), SparePrompts()
    dataloader.load_state_dict(DataLoaderState(epoch=1, position=2))
    spares.load_state_dict(
        SparePromptsState(
            schema_version=1,
            prompts=(SparePrompt(epoch=0, dataset_idx=3), SparePrompt(epoch=0, dataset_idx=1)),
        )
    )
    assert next_prompt(dataloader, spares, max_epochs=2) == (0, 3)
    assert next_prompt(dataloader, spares, max_epochs=2) == (0, 1)
    assert dataloader.state_dict() == DataLoaderState(epoch=1, position=2)
    following = next_prompt(dataloader, spares, max_epochs=2)
    assert following is not None and following[0] == 1


def test_after_the_last_epoch_only_spares_are_left() -> None:
    dataloader, spares = loader(3), SparePrompts()
    dataloader.load_state_dict(DataLoaderState(epoch=1, position=3))
    spares.push(1, 2)
    assert next_prompt(dataloader, spares, max_epochs=2) == (1, 2)
    assert next_prompt(dataloader, spares, max_epochs=2) is None
    refill_spares(dataloader, spares, wanted=2, max_epochs=2)
    assert len(spares) == 0


def test_undrawn_prompts_of_the_epoch_are_the_rest_of_its_order() -> None:
    dataloader = loader(6)
    drawn = [dataloader.next_index() for _ in range(4)]
    undrawn = dataloader.undrawn_in_epoch()
    assert sorted(drawn + undrawn) == [(0, idx) for idx in range(6)]
    assert [dataloader.next_index() for _ in range(2)] == undrawn
    assert dataloader.undrawn_in_epoch() == [] and dataloader.epoch_drawn
    assert dataloader.next_epoch == 1
