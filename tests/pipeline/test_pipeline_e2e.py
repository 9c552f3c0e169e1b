"""End-to-end runs of the pipeline with the simulated gate.

Each asserts the invariants of DESIGN.md that a live run (no restart) must
keep: every prompt of every epoch trained exactly once or given up, no group
trained twice, in-order steps train only their own stamps, staleness bounded,
and no staging row left behind.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pipeline_helpers import logs, prompt_outcomes, run_simulated, small_config

from rollvault.config.schema import RunConfig

NUM_PROMPTS = 24
EPOCHS = 2


def _assert_every_prompt_once(config: RunConfig) -> None:
    outcomes = prompt_outcomes(config)
    expected = {(epoch, str(idx)) for epoch in range(EPOCHS) for idx in range(NUM_PROMPTS)}
    assert set(outcomes) == expected
    assert all(count == 1 for count in outcomes.values()), {
        key: count for key, count in outcomes.items() if count != 1
    }


@pytest.mark.parametrize("granularity", ["sibling", "prompt_group"])
@pytest.mark.parametrize("sampler", ["in_order", "windowed"])
def test_clean_run_trains_every_prompt_once(tmp_path: Path, granularity: str, sampler: str) -> None:
    config = small_config(
        tmp_path,
        f"rollout.recovery_granularity={granularity}",
        f"sampler.kind={sampler}",
        "sampler.max_staleness_versions=100",
    )
    summary, trainer = run_simulated(config)
    trained, dropped, _ = logs(config)
    assert dropped == []
    assert summary.trained_groups == NUM_PROMPTS * EPOCHS
    assert summary.trainer_version == NUM_PROMPTS * EPOCHS // 4
    _assert_every_prompt_once(config)
    assert len({record.group_id for record in trained}) == len(trained)
    assert summary.groups_in_flight == 0 and summary.staging_rows_left == 0


def test_in_order_step_trains_only_groups_stamped_for_it(tmp_path: Path) -> None:
    config = small_config(tmp_path, "sampler.kind=in_order", "sampler.max_lookahead_versions=1")
    _, trainer = run_simulated(config)
    assert trainer.entries
    for step, entry in trainer.entries:
        assert entry.target_step == step
        # Admitted only while its step was within the lookahead of the trainer.
        assert step - entry.start_weight_version <= 1
    per_step = Counter(step for step, _ in trainer.entries)
    assert set(per_step.values()) == {4}


def test_windowed_trains_only_within_the_staleness_window(tmp_path: Path) -> None:
    config = small_config(
        tmp_path,
        "sampler.kind=windowed",
        "sampler.max_staleness_versions=1",
        "gate.simulated.latency_per_token_s=0.0002",
    )
    summary, trainer = run_simulated(config)
    for step, entry in trainer.entries:
        assert entry.target_step is None
        assert step - entry.start_weight_version <= 1
    # Stale groups are given up and counted, never trained late or twice.
    _assert_every_prompt_once(config)
    assert summary.trained_groups + sum(summary.shortfall.values()) == NUM_PROMPTS * EPOCHS


@pytest.mark.parametrize("granularity", ["sibling", "prompt_group"])
def test_transient_failures_are_retried_and_sealed_work_reused(
    tmp_path: Path, granularity: str
) -> None:
    config = small_config(
        tmp_path,
        f"rollout.recovery_granularity={granularity}",
        "gate.simulated.transient_failure_rate=0.15",
        "rollout.max_sibling_retries=20",
    )
    summary, _ = run_simulated(config)
    _, dropped, attempts = logs(config)
    assert summary.infra_failures > 0
    assert dropped == []
    _assert_every_prompt_once(config)
    sealed = Counter(a.group_id for a in attempts if a.status == "sealed")
    abandoned = [a for a in attempts if a.status == "abandoned"]
    if granularity == "sibling":
        # A failure never discards a sibling already sealed: exactly N seals per group.
        assert set(sealed.values()) == {4}
        assert abandoned == []
    else:
        # An atomic group redoes its sealed siblings when one fails.
        assert abandoned
        assert max(sealed.values()) > 4


@pytest.mark.parametrize("policy", ["replace", "shrink"])
def test_permanently_failing_prompts_are_dropped_once(tmp_path: Path, policy: str) -> None:
    config = small_config(
        tmp_path,
        "gate.simulated.permanent_failure_rate=0.1",
        f"rollout.on_dropped_prompt={policy}",
        "rollout.min_step_batch_fraction=0.25",
    )
    summary, trainer = run_simulated(config)
    trained, dropped, _ = logs(config)
    assert dropped, "with a 10% permanent failure rate some prompt must be dropped"
    _assert_every_prompt_once(config)
    assert summary.groups_in_flight == 0 and summary.staging_rows_left == 0
    per_step = Counter(step for step, _ in trainer.entries)
    # A drop shrinks its step exactly when no prompt was left to replace it.
    assert sum(summary.shortfall.values()) == sum(not drop.replaced for drop in dropped)
    if policy == "replace":
        assert any(drop.replaced for drop in dropped)
    else:
        assert not any(drop.replaced for drop in dropped)
        for step, lost in summary.shortfall.items():
            assert per_step[step] == 4 - lost


def test_staging_rows_of_finalized_groups_are_cleared(tmp_path: Path) -> None:
    config = small_config(tmp_path, "grpo.max_num_steps=3")
    summary, _ = run_simulated(config)
    assert summary.trainer_version == 3
    # Rows may remain only for groups still generating when the run stopped.
    assert summary.staging_rows_left <= summary.groups_in_flight * 4
