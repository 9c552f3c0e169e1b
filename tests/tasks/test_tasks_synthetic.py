"""Synthetic dataset: deterministic in any process, bounds-checked, identity digests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollvault.config.schema import DatasetConfig
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import PromptDataset, prompt_identity
from rollvault.tasks.registry import build_dataset
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset


def make(seed: int = 0, num_prompts: int = 32) -> SyntheticPromptDataset:
    return SyntheticPromptDataset(
        num_prompts=num_prompts, prompt_tokens=12, vocab_size=97, seed=seed
    )


def test_items_have_the_datum_shape() -> None:
    dataset = make()
    assert isinstance(dataset, PromptDataset)
    assert len(dataset) == 32
    for idx in range(len(dataset)):
        datum = dataset[idx]
        assert datum["idx"] == idx
        assert datum["task_name"] == "synthetic"
        tokens = datum["prompt_token_ids"]
        assert len(tokens) == 12
        assert all(0 <= token < 97 for token in tokens)


def test_same_arguments_same_prompts() -> None:
    first, second = make(seed=3), make(seed=3)
    assert [first[i] for i in range(32)] == [second[i] for i in range(32)]
    assert [first.identity(i) for i in range(32)] == [second.identity(i) for i in range(32)]


def test_prompts_differ_across_indices_and_seeds() -> None:
    dataset = make(seed=0)
    assert len({tuple(dataset[i]["prompt_token_ids"]) for i in range(32)}) == 32
    assert len({dataset.identity(i) for i in range(32)}) == 32
    other = make(seed=1)
    assert all(dataset.identity(i) != other.identity(i) for i in range(32))


def test_prefix_is_independent_of_dataset_size() -> None:
    # Growing the dataset must not change the prompts a checkpoint already refers to.
    assert [make(num_prompts=8)[i] for i in range(8)] == [make(num_prompts=64)[i] for i in range(8)]


def test_same_prompts_in_a_fresh_process_with_another_hash_seed() -> None:
    script = (
        "import json\n"
        "from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset\n"
        "d = SyntheticPromptDataset(num_prompts=32, prompt_tokens=12, vocab_size=97, seed=5)\n"
        "print(json.dumps([[d[i]['prompt_token_ids'], d.identity(i)] for i in range(32)]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout
    here = make(seed=5)
    assert json.loads(out) == [[here[i]["prompt_token_ids"], here.identity(i)] for i in range(32)]


def test_generation_scheme_is_pinned() -> None:
    # Checkpoints refer to prompts by index and digest: changing how synthetic
    # prompts are generated would make every old checkpoint unrestorable.
    dataset = SyntheticPromptDataset(num_prompts=4, prompt_tokens=5, vocab_size=512, seed=0)
    assert dataset[0]["prompt_token_ids"] == [308, 185, 442, 281, 409]
    assert dataset.identity(0) == "427a199929ab96157090040c0b75a85ff4ddbc099e9a0274c445efd6f9c48ebb"


def test_identity_is_the_digest_of_the_item_and_sees_every_field() -> None:
    dataset = make()
    datum = dataset[3]
    assert dataset.identity(3) == prompt_identity(datum)
    tokens = datum["prompt_token_ids"]
    one_token_changed: DatumSpec = {
        **datum,
        "prompt_token_ids": [*tokens[:-1], (tokens[-1] + 1) % 97],
    }
    other_task: DatumSpec = {**datum, "task_name": "other"}
    assert prompt_identity(one_token_changed) != dataset.identity(3)
    assert prompt_identity(other_task) != dataset.identity(3)


def test_identity_ignores_key_order() -> None:
    datum = make()[2]
    reordered = dict(reversed(list(datum.items())))
    # A plain dict: a DatumSpec cannot be built in a computed key order.
    assert prompt_identity(reordered) == prompt_identity(datum)  # type: ignore[arg-type]


@pytest.mark.parametrize("idx", [-1, 32, 1000])
def test_out_of_range_index_is_rejected(idx: int) -> None:
    with pytest.raises(IndexError, match=f"index {idx} out of range"):
        make()[idx]
    with pytest.raises(IndexError):
        make().identity(idx)


@pytest.mark.parametrize("idx", [True, 1.0, "1"])
def test_non_int_index_is_rejected(idx: object) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        make()[idx]  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_prompts": 0}, "num_prompts"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"vocab_size": 1}, "vocab_size"),
    ],
)
def test_bad_constructor_arguments_are_named(kwargs: dict[str, int], name: str) -> None:
    args = {"num_prompts": 4, "prompt_tokens": 4, "vocab_size": 8, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=name):
        SyntheticPromptDataset(**args)


def test_build_dataset_follows_config() -> None:
    dataset = build_dataset(DatasetConfig(num_prompts=10, prompt_tokens=3), vocab_size=50, seed=2)
    assert len(dataset) == 10
    assert len(dataset[9]["prompt_token_ids"]) == 3
    assert dataset[9] == SyntheticPromptDataset(10, 3, 50, 2)[9]
