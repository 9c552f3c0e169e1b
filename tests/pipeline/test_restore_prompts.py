"""A restore rebinds each restored group's prompt from the dataset and checks its identity.

The row and its identity come from one build when the dataset can give both
(``row_with_identity``, every generated task's dataset); a dataset with only
``__getitem__`` and ``identity`` (a user's own) is asked both, as before, and a
subclass that overrides ``identity`` alone is asked its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pipeline_helpers import run_until_crash, small_config

from rollvault.config.schema import RunConfig
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.snapshots.restorer import RestoreError, RolloutRestorer
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.ledger.datum import DatumSpec
from rollvault.tasks.protocols import PromptDataset
from rollvault.tasks.synthetic.dataset import SyntheticPromptDataset
from rollvault.training.recording import RecordingTrainer


class CountedRows(SyntheticPromptDataset):
    """The run's dataset, counting each row it builds."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(
            config.dataset.num_prompts,
            config.dataset.prompt_tokens,
            config.gate.simulated.vocab_size,
            config.seed,
        )
        self.built: list[int] = []

    def __getitem__(self, idx: int) -> DatumSpec:
        self.built.append(idx)
        return super().__getitem__(idx)


class ChangedIdentity(CountedRows):
    """Overrides ``identity`` alone, as a user's subclass may: it must be the one asked."""

    def identity(self, idx: int) -> str:
        return "0" * 64


class OwnDataset:
    """A user's dataset with today's three methods only (no ``row_with_identity``)."""

    def __init__(self, rows: SyntheticPromptDataset) -> None:
        self._rows = rows
        self.identities: list[int] = []

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, idx: int) -> DatumSpec:
        return self._rows[idx]

    def identity(self, idx: int) -> str:
        self.identities.append(idx)
        return self._rows.identity(idx)


@pytest.fixture
def crashed(tmp_path: Path) -> RunConfig:
    # Slow generation and frequent snapshots: the snapshot holds groups in flight.
    config = small_config(
        tmp_path,
        "gate.simulated.latency_per_token_s=0.002",
        "rollout_checkpointing.interval_s=0.05",
        "checkpointing.save_period=1000",
    )
    run_until_crash(config, 3)
    return config


def _restore(config: RunConfig, dataset: PromptDataset) -> tuple[RolloutParts, RolloutRestorer]:
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    parts = build_parts(config, dataset=dataset)
    restorer = RolloutRestorer(
        parts,
        trainer=RecordingTrainer(),
        buffer_capacity=ReplayCapacity(config.rollout.max_buffered_rollouts),
        resume=source,
    )
    try:
        asyncio.run(restorer.restore())
    finally:
        parts.logs.close()
        if parts.seal_journal is not None:
            parts.seal_journal.close()
    return parts, restorer


def _bound(parts: RolloutParts) -> dict[int, DatumSpec]:
    """Each restored group's bound prompt, by dataset index."""
    bound = {}
    for record in parts.ledger.borrowed_groups():
        assert record.runtime_prompt_payload is not None
        bound[parts.group(record.group_id).origin.dataset_idx] = record.runtime_prompt_payload
    return bound


def test_each_restored_groups_row_is_built_once_and_checked(crashed: RunConfig) -> None:
    dataset = CountedRows(crashed)
    parts, restorer = _restore(crashed, dataset)
    bound = _bound(parts)
    assert bound and restorer.restored_group_ids
    assert sorted(dataset.built) == sorted(bound)  # one build per group: row and identity
    reference = CountedRows(crashed)
    assert bound == {idx: reference[idx] for idx in bound}


def test_a_dataset_with_only_identity_and_rows_is_asked_both(crashed: RunConfig) -> None:
    dataset = OwnDataset(CountedRows(crashed))
    parts, _ = _restore(crashed, dataset)
    bound = _bound(parts)
    assert bound and sorted(dataset.identities) == sorted(bound)
    assert bound == {idx: dataset[idx] for idx in bound}


def test_a_subclass_overriding_identity_alone_is_asked_its_own(crashed: RunConfig) -> None:
    with pytest.raises(RestoreError, match="no longer holds the prompt it was reserved with"):
        _restore(crashed, ChangedIdentity(crashed))
