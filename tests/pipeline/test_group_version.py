"""``prompt_group`` means one weight version per group.

A gate that lets a weight update land in the middle of a group (one sibling
generated with the next version, as when the local model gate splits a group
across two batches and loads new weights between them) must never get that
group trained mixed under ``prompt_group``: the group is redone whole, as an
infrastructure retry. Under ``sibling`` the mixed group trains as it is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from pipeline_helpers import (
    BatchKeepingTrainer,
    dataset_of,
    expected_prompts,
    logs,
    prompt_outcomes,
    run_simulated,
    run_stalled_then_kill,
    small_config,
)

from rollvault.config.schema import RunConfig, SimulatedGateConfig
from rollvault.controller.loop.gate import AttemptOutcome, AttemptRequest
from rollvault.controller.loop.group_version import ReceiptVersionError, receipt_with_version
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.protocols import Environment
from rollvault.tasks.synthetic.environment import ParityEnvironment

GENERATIONS = 4
STRADDLED_GROUPS = 2


class StraddlingGate(SimulatedGate):
    """Reports the next weight version for the first attempt of the last sibling of
    the first ``straddled_groups`` groups: an update that landed mid-group."""

    def __init__(
        self,
        config: SimulatedGateConfig,
        data_plane: DataPlane,
        environment: Environment,
        *,
        seed: int,
        straddled_groups: int,
    ) -> None:
        super().__init__(config, data_plane, environment, seed=seed)
        self._straddles_left = straddled_groups
        self.straddled: dict[str, str] = {}
        """Group id -> gate rollout id of the attempt that saw the next version."""
        self.versions: dict[str, int] = {}
        """Gate rollout id -> the version its outcome reported, for every outcome."""

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        outcome = await super().run_attempt(request)
        straddle = (
            request.generation_index == GENERATIONS - 1
            and self._straddles_left > 0
            and request.group_id not in self.straddled
        )
        if straddle:
            self._straddles_left -= 1
            self.straddled[request.group_id] = request.gate_rollout_id
            version = outcome.weight_version + 1
            outcome = msgspec.structs.replace(
                outcome,
                weight_version=version,
                receipt={**outcome.receipt, "weight_version": version},
            )
        self.versions[request.gate_rollout_id] = outcome.weight_version
        return outcome


def _run(config: RunConfig) -> tuple[RunSummary, BatchKeepingTrainer, StraddlingGate]:
    trainer = BatchKeepingTrainer()
    gates: list[StraddlingGate] = []

    def gate(data_plane: DataPlane) -> StraddlingGate:
        built = StraddlingGate(
            config.gate.simulated,
            data_plane,
            ParityEnvironment(),
            seed=config.seed,
            straddled_groups=STRADDLED_GROUPS,
        )
        gates.append(built)
        return built

    async def main() -> RunSummary:
        return await run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config))

    summary = asyncio.run(main())
    assert len(gates) == 1
    assert len(gates[0].straddled) == STRADDLED_GROUPS, "no weight update landed mid-group"
    return summary, trainer, gates[0]


def _config(tmp_path: Path, granularity: str) -> RunConfig:
    return small_config(
        tmp_path,
        f"rollout.recovery_granularity={granularity}",
        "dataset.num_prompts=8",
        "grpo.max_num_epochs=1",
        f"grpo.num_generations_per_prompt={GENERATIONS}",
    )


def test_prompt_group_redoes_a_group_that_straddles_a_weight_update(tmp_path: Path) -> None:
    config = _config(tmp_path, "prompt_group")
    summary, trainer, gate = _run(config)
    trained, dropped, attempts = logs(config)
    assert dropped == []
    assert summary.trained_groups == 8
    # Every trained group's siblings were generated with one version.
    for record in trained:
        versions = {gate.versions[rollout_id] for rollout_id in record.gate_rollout_ids}
        assert len(versions) == 1, (record.group_id, versions)
    by_group = {record.group_id: record for record in trained}
    entries = {entry.group_id: entry for _, entry in trainer.entries}
    for group_id, straddler in gate.straddled.items():
        # Redone whole: the first cohort (one attempt per slot) trained none of its
        # attempts; its sealed ones were discarded, the off-version ones failed.
        group_attempts = [a for a in attempts if a.group_id == group_id]
        trained_ids = set(by_group[group_id].gate_rollout_ids)
        first_cohort = {a.gate_rollout_id for a in group_attempts} - trained_ids
        assert straddler in first_cohort
        assert sorted(_slot(rollout_id) for rollout_id in first_cohort) == _slots(group_id)
        sealed = {a.gate_rollout_id for a in group_attempts if a.status == "sealed"}
        abandoned = {a.gate_rollout_id for a in group_attempts if a.status == "abandoned"}
        failed = [a for a in group_attempts if a.status == "failed"]
        assert sealed & first_cohort and sealed & first_cohort == abandoned
        assert failed and all("weight version" in (a.reason or "") for a in failed)
        assert {a.gate_rollout_id for a in failed} == first_cohort - abandoned
        # The replay entry's version is the trained siblings' one, not the discarded one.
        (version,) = {gate.versions[rollout_id] for rollout_id in trained_ids}
        assert entries[group_id].end_weight_version == version
    # Charged as infrastructure failures, one per refused attempt; never as data.
    refused = [a for a in attempts if a.status == "failed"]
    assert summary.infra_failures == len(refused) >= STRADDLED_GROUPS
    assert summary.data_failures == 0
    assert summary.staging_rows_left == 0


def test_sibling_granularity_trains_a_straddling_group_as_it_is(tmp_path: Path) -> None:
    config = _config(tmp_path, "sibling")
    summary, trainer, gate = _run(config)
    trained, dropped, attempts = logs(config)
    assert dropped == []
    assert summary.trained_groups == 8
    assert summary.infra_failures == 0
    assert [a for a in attempts if a.status != "sealed"] == []
    by_group = {record.group_id: record for record in trained}
    entries = {entry.group_id: entry for _, entry in trainer.entries}
    for group_id, straddler in gate.straddled.items():
        trained_ids = by_group[group_id].gate_rollout_ids
        assert straddler in trained_ids
        versions = {gate.versions[rollout_id] for rollout_id in trained_ids}
        assert len(versions) == 2
        assert entries[group_id].end_weight_version == max(versions)


def test_snapshots_keep_each_sealed_siblings_weight_version(tmp_path: Path) -> None:
    # Sibling 3 of every group hangs: the snapshot holds groups with 3 siblings sealed.
    config = small_config(
        tmp_path,
        "gate.simulated.latency_per_token_s=0.002",
        "rollout_checkpointing.interval_s=0.05",
    )
    run_stalled_then_kill(config, stalled_index=3)
    source = prepare_checkpoint_dir(config)
    assert source is not None and source.snapshot is not None
    records = RolloutRecoveryLedger.from_state_dict(source.snapshot.recovery.ledger_state).groups()
    sealed = [
        (record, sibling.current_attempt)
        for record in records
        for sibling in record.siblings
        if sibling.current_attempt.status is RolloutAttemptStatus.SEALED
    ]
    assert sealed
    for record, attempt in sealed:
        assert attempt.receipt is not None
        version = attempt.receipt["weight_version"]
        assert isinstance(version, int) and version >= record.start_weight_version
    # The restored seals (with their versions) finish their groups: every prompt once.
    summary, _ = run_simulated(config)
    assert prompt_outcomes(config) == dict.fromkeys(expected_prompts(24, 2), 1)
    assert summary.groups_in_flight == 0 and summary.staging_rows_left == 0


def test_the_outcome_version_is_recorded_in_the_receipt() -> None:
    receipt = {"gate_rollout_id": "g_g0_a1", "staging_keys": ["k"]}
    recorded = receipt_with_version(receipt, 2, gate_rollout_id="g_g0_a1")
    assert recorded == {**receipt, "weight_version": 2}
    assert "weight_version" not in receipt  # the gate's dict is not changed
    assert receipt_with_version(recorded, 2, gate_rollout_id="g_g0_a1") == recorded
    with pytest.raises(ReceiptVersionError, match="receipt says weight_version 1, the outcome"):
        receipt_with_version({**receipt, "weight_version": 1}, 2, gate_rollout_id="g_g0_a1")


def _slots(group_id: str) -> list[str]:
    return [f"{group_id}_g{index}" for index in range(GENERATIONS)]


def _slot(gate_rollout_id: str) -> str:
    """The logical rollout id ``{group}_g{i}`` of an attempt ``{group}_g{i}_a{hex}``."""
    return gate_rollout_id.rsplit("_a", 1)[0]
