"""A stop request (what ``rollvault run`` makes of SIGTERM/SIGINT), in-process.

The request comes from the step callback, so it lands at a known step; the
real-process tests with signals are in tests/cli/test_cli_run_signals.py.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from pipeline_helpers import dataset_of, expected_prompts, run_simulated, small_config

from rollvault.checkpoint_tools.run_history import (
    check_exactly_once,
    check_sibling_reuse,
    read_run_history,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.controller.loop.run_logs import (
    SHUTDOWNS_LOG_FILENAME,
    ShutdownLogRecord,
    read_jsonl,
)
from rollvault.controller.loop.shutdown import Shutdown
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer

SLOW_GATE = (
    "gate.simulated.latency_per_token_s=0.002",
    # No periodic snapshot: what a restart keeps is the final snapshot's doing.
    "rollout_checkpointing.interval_s=3600",
    "checkpointing.save_period=4",
)


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, *SLOW_GATE, *overrides)


def _run_stopped_at(config: RunConfig, step: int | None) -> tuple[RunSummary, Shutdown]:
    """Run ``config``; request a stop right after ``step`` (None: before the run starts)."""

    def gate(data_plane: DataPlane) -> SimulatedGate:
        return SimulatedGate(
            config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed
        )

    async def main() -> tuple[RunSummary, Shutdown]:
        shutdown = Shutdown()
        if step is None:
            shutdown.request(signal.SIGTERM)

        def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
            if parts.trainer_version == step:
                shutdown.request(signal.SIGTERM)

        summary = await run(
            config,
            gate_factory=gate,
            trainer=RecordingTrainer(),
            dataset=dataset_of(config),
            on_step=on_step,
            shutdown=shutdown,
        )
        return summary, shutdown

    return asyncio.run(main())


def _sealed(config: RunConfig, incarnation: int) -> set[tuple[str, int]]:
    history = read_run_history(Path(config.logging.log_dir))
    return {
        (a.group_id, a.generation_index)
        for a in history.attempts
        if a.incarnation == incarnation and a.status is RolloutAttemptStatus.SEALED
    }


def test_a_stop_request_writes_a_final_snapshot_that_the_restart_resumes_from(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    summary, shutdown = _run_stopped_at(config, step=6)
    stopped = summary.shutdown
    assert stopped is not None and shutdown.signal is signal.SIGTERM
    assert stopped.signal == "SIGTERM" and not stopped.grace_exceeded
    # Steps 0-3 are in step_4; the final snapshot keeps steps 4-5 to train again.
    assert summary.trainer_version == 6 and stopped.base_train_step == 4
    assert stopped.final_snapshot is not None and Path(stopped.final_snapshot).is_dir()
    assert stopped.resume_from == stopped.final_snapshot
    assert stopped.attempts_in_flight > 0, "the slowed gate had attempts in flight"
    logged = read_jsonl(Path(config.logging.log_dir) / SHUTDOWNS_LOG_FILENAME, ShutdownLogRecord)
    assert [r.final_snapshot for r in logged] == [stopped.final_snapshot]
    before = _sealed(config, incarnation=1)
    assert before

    finished, _ = run_simulated(config)

    history = read_run_history(Path(config.logging.log_dir))
    assert [r.snapshot for r in history.restores] == [stopped.final_snapshot]
    # Exactly the attempts in flight at the stop are redone.
    assert history.restores[0].attempts_redispatched == stopped.attempts_in_flight
    assert finished.trainer_version == 12 and finished.shutdown is None
    assert check_exactly_once(history, expected_prompts(24, 2)) == []
    assert check_sibling_reuse(history) == []
    assert not before & _sealed(config, incarnation=2), "a sibling sealed before the stop ran again"
    assert not any(history.is_void(a.incarnation, a.seq) for a in history.attempts)


def test_a_request_before_the_pumps_start_dispatches_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path)
    summary, _ = _run_stopped_at(config, step=None)
    assert summary.shutdown is not None and summary.trainer_version == 0
    assert summary.shutdown.attempts_in_flight == 0
    assert read_run_history(Path(config.logging.log_dir)).attempts == []
    finished, _ = run_simulated(config)
    assert finished.trainer_version == 12
    history = read_run_history(Path(config.logging.log_dir))
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_past_the_grace_the_run_stops_without_a_final_snapshot(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "rollout_checkpointing.shutdown_grace_s=1e-6",
        "rollout_checkpointing.interval_s=0.05",
    )
    summary, _ = _run_stopped_at(config, step=6)
    stopped = summary.shutdown
    assert stopped is not None and stopped.grace_exceeded
    assert stopped.final_snapshot is None
    # A restart resumes from the last snapshot committed before the stop (or from one
    # the periodic checkpointer's thread was still writing, which in-process may commit).
    assert stopped.resume_from is not None and Path(stopped.resume_from).is_dir()
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    anchor = Path(config.checkpointing.checkpoint_dir) / f"step_{stopped.base_train_step}"
    restored = history.restores[0].snapshot
    assert restored is not None and Path(restored).is_relative_to(anchor)
    assert Path(stopped.resume_from).is_relative_to(anchor)
    assert check_exactly_once(history, expected_prompts(24, 2)) == []


def test_only_the_first_request_counts() -> None:
    async def main() -> None:
        shutdown = Shutdown()
        assert not shutdown.requested
        with pytest.raises(RuntimeError, match="no stop was requested"):
            shutdown.deadline(1.0)
        assert shutdown.request(signal.SIGINT)
        deadline = shutdown.deadline(5.0)
        assert not shutdown.request(signal.SIGTERM)
        assert shutdown.signal is signal.SIGINT and shutdown.deadline(5.0) == deadline
        await asyncio.wait_for(shutdown.wait(), 1.0)

    asyncio.run(main())
