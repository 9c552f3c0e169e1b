"""The simulated run: seeded tokens from the simulated gate, the recording trainer."""

from __future__ import annotations

from rollvault.config.schema import RunConfig
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.simulated import SimulatedGate
from rollvault.recipes.run_parts import CountingGate, PreparedRun, prompt_dataset, token_environment
from rollvault.tasks.protocols import Task
from rollvault.training.recording import RecordingTrainer

__all__ = ["prepare_simulated_run"]


def prepare_simulated_run(config: RunConfig, task: Task) -> PreparedRun:
    """The simulated gate (seeded tokens, injectable failures) and the recording trainer."""
    token_environment(config, task)  # refuse a task it cannot score before the run starts
    gates: list[CountingGate] = []

    def simulated_gate(data_plane: DataPlane) -> SimulatedGate:
        gate = SimulatedGate(
            config.gate.simulated, data_plane, token_environment(config, task), seed=config.seed
        )
        gates.append(gate)
        return gate

    return PreparedRun(
        config=config,
        task=task,
        dataset=prompt_dataset(config, task),
        trainer=RecordingTrainer(),
        gate_factory=simulated_gate,
        gates=gates,
    )
