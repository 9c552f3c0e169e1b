"""Build the trainer and the gate a run config asks for.

``simulated`` + ``recording``: the deterministic simulated gate and the
recording trainer (tests, benchmarks of the controller). ``local_model`` +
``grpo``: the real recipe, a causal LM generating in a worker process and a
GRPO trainer updating it (see :mod:`rollvault.training.grpo_setup`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollvault.config.schema import RunConfig, TrainerKind
from rollvault.controller.loop.pipeline import GateFactory
from rollvault.controller.loop.trainer import Trainer
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.grpo_setup import build_grpo_run
from rollvault.training.recording import RecordingTrainer
from rollvault.training.warmup import WarmupReport

__all__ = ["RunSetup", "build_run_setup"]


@dataclass
class RunSetup:
    """What one start runs with."""

    trainer: Trainer
    gate_factory: GateFactory
    tokens_generated: Callable[[], int]
    """Response tokens generated so far by this start's gate(s)."""
    warmup: WarmupReport | None = None


def build_run_setup(config: RunConfig) -> RunSetup:
    """The trainer and gate factory for ``config`` (the GRPO path may warm the model up)."""
    if config.trainer.kind is TrainerKind.GRPO:
        grpo = build_grpo_run(config)
        return RunSetup(
            trainer=grpo.trainer,
            gate_factory=grpo.gate_factory,
            tokens_generated=lambda: sum(gate.tokens_generated for gate in grpo.gates),
            warmup=grpo.warmup,
        )
    gates: list[SimulatedGate] = []

    def simulated_gate(data_plane: DataPlane) -> SimulatedGate:
        gate = SimulatedGate(
            config.gate.simulated, data_plane, ParityEnvironment(), seed=config.seed
        )
        gates.append(gate)
        return gate

    return RunSetup(
        trainer=RecordingTrainer(),
        gate_factory=simulated_gate,
        tokens_generated=lambda: sum(gate.tokens_generated for gate in gates),
    )
