"""``run(before_start=...)``: called once the checkpoint directory is checked, before the gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pipeline_helpers import dataset_of, small_config

from rollvault.config.schema import RunConfig
from rollvault.controller.loop.pipeline import run
from rollvault.controller.snapshots.resume import ResumeSource
from rollvault.dataplane.interface import DataPlane
from rollvault.durable.errors import IncompatibleRunError
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer


def _run(config: RunConfig, events: list[object]) -> None:
    def gate(data_plane: DataPlane) -> SimulatedGate:
        events.append("gate")
        return SimulatedGate(
            config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed
        )

    def before_start(resume: ResumeSource | None) -> None:
        anchor = Path(config.checkpointing.checkpoint_dir) / "bootstrap" / "manifest.json"
        assert anchor.is_file(), "called before the anchor exists"
        events.append(resume)

    asyncio.run(
        run(
            config,
            gate_factory=gate,
            trainer=RecordingTrainer(),
            dataset=dataset_of(config),
            before_start=before_start,
        )
    )


def test_a_fresh_start_gets_none_and_a_restart_its_resume_source(tmp_path: Path) -> None:
    first: list[object] = []
    _run(small_config(tmp_path, "grpo.max_num_steps=2"), first)
    assert first == [None, "gate"]
    second: list[object] = []
    _run(small_config(tmp_path, "grpo.max_num_steps=3"), second)
    assert len(second) == 2 and second[1] == "gate"
    resume = second[0]
    assert isinstance(resume, ResumeSource) and resume.base_step == 2


def test_a_refused_start_never_calls_it(tmp_path: Path) -> None:
    _run(small_config(tmp_path, "grpo.max_num_steps=1"), [])
    events: list[object] = []
    with pytest.raises(IncompatibleRunError):
        _run(small_config(tmp_path, "grpo.max_num_steps=1", "seed=7"), events)
    assert events == []
