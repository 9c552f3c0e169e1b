"""A GRPO run of the addition recipe on the vLLM gate, with its server SIGKILLed mid-run.

The run is the recipe's own composition (``prepare``: task, warm-up, GRPO
trainer, ``gate.kind=vllm``), except that its gate adopts the session's
managed server instead of starting a second one (a start costs a minute
here). After the first step the test SIGKILLs the server by its pid: the
attempts in flight fail as infra, the gate restarts the server and refits it
to the current weight version, and the run finishes with every prompt trained
exactly once, each group's receipts naming the version that generated them.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from rollvault.config.loading import load_run_config
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    AttemptLogRecord,
    TrainLogRecord,
    read_jsonl,
)
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.prompt_rendering import PromptFormat
from rollvault.gates.vllm.client import VllmClient
from rollvault.gates.vllm.fleet import Server
from rollvault.gates.vllm.gate import VllmGate
from rollvault.gates.vllm.health import ServerHealth
from rollvault.gates.vllm.launch import ManagedServer
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.recipes.async_grpo import prepare, train
from rollvault.recipes.run_parts import text_environment

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[3] / "src/rollvault/configs/grpo_addition_vllm.yaml"
STEPS = 6
PROMPTS_PER_STEP = 4


def test_a_run_survives_a_killed_server_and_trains_every_prompt_once(
    vllm_server: ManagedServer, vllm_model_dir: Path, tmp_path: Path
) -> None:
    config = load_run_config(
        RECIPE,
        [
            f"grpo.max_num_steps={STEPS}",
            f"grpo.num_prompts_per_step={PROMPTS_PER_STEP}",
            "grpo.num_generations_per_prompt=4",
            "dataset.num_prompts=200",
            "trainer.warmup.steps=20",
            "rollout.max_inflight_prompts=8",
            "rollout.max_buffered_rollouts=16",
            f"model.path={vllm_model_dir}",
            f"logging.log_dir={tmp_path / 'logs'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            f"gate.vllm.weights_dir={tmp_path / 'vllm'}",
            "gate.vllm.startup_timeout_s=240",
        ],
    )
    prepared = prepare(config)
    assert prepared.policy is not None
    trainer = prepared.policy.trainer
    gates: list[VllmGate] = []

    def adopting_gate(data_plane: DataPlane) -> VllmGate:
        client = VllmClient(vllm_server.url, model=str(vllm_model_dir), timeout_s=30.0)
        gate = VllmGate(
            config.gate.vllm,
            data_plane,
            text_environment(config, prepared.task),
            model_path=vllm_model_dir,
            weights_provider=trainer.weights_for_gate,
            seed=config.seed,
            prompt_format=PromptFormat.from_config(config.model),
            # Restarted by the gate when it dies, but left running at the end: it is the session's.
            servers=[Server(client=client, managed=vllm_server, stop_on_close=False)],
        )
        gates.append(gate)
        return gate

    prepared.gate_factory = adopting_gate
    killed: list[int] = []

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        if not killed and vllm_server.pid is not None:
            killed.append(vllm_server.pid)
            os.kill(vllm_server.pid, signal.SIGKILL)

    summary = asyncio.run(train(prepared, on_step=on_step))
    assert summary is not None
    gate = gates[0]
    server = gate.fleet.servers[0]
    assert killed and vllm_server.pid != killed[0] and server.restarts == 1
    assert gate.fleet.health.state(server.name) is ServerHealth.HEALTHY
    assert gate.weight_syncs >= STEPS - 1

    logs = tmp_path / "logs"
    trained = read_jsonl(logs / TRAIN_LOG_FILENAME, TrainLogRecord)
    counts = Counter(record.sample_id for record in trained)
    assert len(counts) == STEPS * PROMPTS_PER_STEP and set(counts.values()) == {1}
    attempts = read_jsonl(logs / ATTEMPTS_LOG_FILENAME, AttemptLogRecord)
    failed = [a for a in attempts if a.status is RolloutAttemptStatus.FAILED]
    print(f"{len(failed)} attempts failed when the server was killed; {len(attempts)} in all")
    assert failed and summary.infra_failures == len(failed) and summary.data_failures == 0
    assert summary.dropped_groups == 0
    # The server went down, was restarted, came back stale and was refitted.
    states = [to for name, _, _, to in gate.fleet.health.history if name == server.name]
    dead = states.index(ServerHealth.DEAD)
    assert states[dead - 1 : dead + 4] == [
        ServerHealth.SUSPECT,
        ServerHealth.DEAD,
        ServerHealth.RESTARTING,
        ServerHealth.STALE,
        ServerHealth.HEALTHY,
    ]
