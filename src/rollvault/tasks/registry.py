"""The dataset a run config asks for."""

from __future__ import annotations

from rollvault.config.schema import DatasetConfig, DatasetKind
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.protocols import PromptDataset
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset

__all__ = ["build_dataset"]


def build_dataset(config: DatasetConfig, *, vocab_size: int, seed: int) -> PromptDataset:
    """The dataset a run config asks for."""
    if config.kind is DatasetKind.SYNTHETIC:
        return SyntheticPromptDataset(config.num_prompts, config.prompt_tokens, vocab_size, seed)
    if config.kind is DatasetKind.ADDITION:
        return AdditionPromptDataset(config.num_prompts, seed=seed)
    raise ValueError(f"dataset.kind {config.kind.value!r} has no builder")
