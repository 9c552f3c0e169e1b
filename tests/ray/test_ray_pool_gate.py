"""The Ray pool gate on a private local Ray: rows, receipts, routing, broadcast, a killed actor."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from ray_helpers import private_ray
from safetensors.torch import save

import rollvault
from rollvault.checkpoint_tools.chaos.checks import check_finished_run
from rollvault.checkpoint_tools.chaos.plan import CHAOS_OVERRIDES
from rollvault.config.loading import load_run_config
from rollvault.config.schema import LocalModelGateConfig, RayGateConfig, TrainerPlacement
from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    FailureKind,
    GateAttemptError,
    staged_row_digest,
)
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.trainer import TrainerLostError
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.gates.local_model import LocalModelGate
from rollvault.gates.ray_pool import ActorHealth, RayPoolGate
from rollvault.ledger.receipts import validate_receipt
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.recipes.async_grpo import prepare, train
from rollvault.recipes.ray_processes import marked_processes
from rollvault.recipes.ray_runtime import RaySession
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.training.model_store import ensure_model_dir, load_model_dir
from rollvault.training.ray_trainer import RayTrainer

pytestmark = pytest.mark.slow

DATA = AdditionPromptDataset(64, seed=0)
SAMPLING = LocalModelGateConfig(temperature=1.0, max_new_tokens=6, max_batch_size=64)


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaySession]:
    run_dir = tmp_path_factory.mktemp("ray_pool")
    with private_ray(run_dir) as session:
        yield session
    # The run's Ray is gone with its end: no process of it is left.
    assert session.temp_dir is not None and marked_processes(str(session.temp_dir)) == []


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_model_dir(tmp_path_factory.mktemp("model") / "model", build_default=True, seed=0)


class _Weights:
    """A weights provider the test can change, like a trainer between steps."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return save(
            {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}
        )


def _sibling(group: int, index: int, attempt: str = "a") -> AttemptRequest:
    return AttemptRequest(
        group_id=f"p{group}",
        generation_index=index,
        gate_rollout_id=f"p{group}_g{index}_{attempt}{group}x{index}",
        prompt=dict(DATA[group]),
        weight_version=0,
    )


def _pool(
    model_dir: Path,
    weights: _Weights,
    data_plane: EmbeddedDataPlane,
    sampling: LocalModelGateConfig = SAMPLING,
) -> RayPoolGate:
    return RayPoolGate(
        sampling,
        data_plane,
        AdditionEnvironment(),
        pool=RayGateConfig(num_actors=2, num_cpus_per_actor=1.0, actor_call_timeout_s=60.0),
        model_path=model_dir,
        weights_provider=weights,
        seed=0,
    )


async def _groups(gate: LocalModelGate, groups: range, size: int, attempt: str = "a") -> list:
    return list(
        await asyncio.gather(
            *(gate.run_attempt(_sibling(g, i, attempt)) for g in groups for i in range(size))
        )
    )


def test_pool_rows_and_receipts_match_the_local_gate_and_name_their_actor(
    ray_session: RaySession, model_dir: Path
) -> None:
    torch.set_num_threads(1)
    model, _ = load_model_dir(model_dir)
    weights = _Weights(model)

    async def main() -> None:
        pool_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        local_plane = EmbeddedDataPlane(DataPlaneMutationCut())
        pool = _pool(model_dir, weights, pool_plane)
        local = LocalModelGate(
            SAMPLING, local_plane, AdditionEnvironment(), model_path=model_dir,
            weights_provider=weights, seed=0,
        )  # fmt: skip
        try:
            await pool.ready()
            assert set(pool.actor_health.values()) == {ActorHealth.HEALTHY}
            from_pool = await _groups(pool, range(6), 4)
            from_local = await _groups(local, range(6), 4)
            # The same engine and the same seeds: the same tokens and rows (logprobs to
            # float rounding: see _same_rows).
            await _same_rows(from_pool, pool_plane, from_local, local_plane)
            actors = {o.receipt["worker_id"] for o in from_pool}
            assert actors == set(pool.actor_pids)  # least loaded: both actors got groups
            # Sticky: every group's siblings came from one actor.
            by_group = {(o.receipt["gate_rollout_id"].split("_")[0], o.receipt["worker_id"])
                        for o in from_pool}  # fmt: skip
            assert len(by_group) == 6
            for outcome in from_pool:
                assert validate_receipt(outcome.receipt).worker_id in actors
            # One ray.put per weight version, whatever the pool size.
            calls = weights.calls
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.mul_(1.05)
            await pool.update_weights(1)
            assert pool.weight_puts == 2 and weights.calls == calls + 1
            await local.update_weights(1)
            later = await _groups(pool, range(6, 12), 4, "b")
            assert {o.weight_version for o in later} == {1}
            assert {o.receipt["worker_id"] for o in later} == actors
            await _same_rows(later, pool_plane, await _groups(local, range(6, 12), 4, "b"),
                             local_plane)  # fmt: skip
            with pytest.raises(ValueError, match="went back"):
                await pool.update_weights(0)
        finally:
            await pool.close()
            await local.close()

    asyncio.run(main())


# Generation logprobs of the same tokens differ in the last bits between the actor's
# process and the local gate's worker on an AVX-512 machine (measured: at most 4.8e-7,
# 0-2 ulp; why is not established: the two batch the rows differently); they were
# bit-identical on the machine this test was written on. Every other field must match.
_LOGPROB_ATOL = 1e-5


async def _same_rows(
    first: list[AttemptOutcome],
    first_plane: EmbeddedDataPlane,
    second: list[AttemptOutcome],
    second_plane: EmbeddedDataPlane,
) -> None:
    keys = [o.receipt["staging_keys"][0] for o in first]
    assert keys == [o.receipt["staging_keys"][0] for o in second]
    rows = await first_plane.get(STAGING_PARTITION, keys)
    again = await second_plane.get(STAGING_PARTITION, keys)
    for one, other, key in zip(first, second, keys, strict=True):
        # Each receipt's digest is of the row its own gate staged.
        assert staged_row_digest(rows[key]) == one.receipt["row_digests"][0]["digest"]
        assert staged_row_digest(again[key]) == other.receipt["row_digests"][0]["digest"]
        assert rows[key].keys() == again[key].keys()
        for field, value in rows[key].items():
            if field == "generation_logprobs":
                np.testing.assert_allclose(value, again[key][field], rtol=0, atol=_LOGPROB_ATOL)
            else:
                np.testing.assert_array_equal(value, again[key][field], err_msg=f"{key} {field}")
        assert one.reward == other.reward and one.weight_version == other.weight_version


def test_a_killed_actor_fails_its_batch_as_infra_and_comes_back_on_the_current_version(
    ray_session: RaySession, model_dir: Path
) -> None:
    torch.set_num_threads(1)
    model, _ = load_model_dir(model_dir)

    async def main() -> None:
        # Small batches: the kill lands with batches running and batches queued.
        small = LocalModelGateConfig(temperature=1.0, max_new_tokens=6, max_batch_size=4)
        pool = _pool(model_dir, _Weights(model), EmbeddedDataPlane(DataPlaneMutationCut()), small)
        try:
            await pool.ready()
            await pool.update_weights(3)
            name, pid = next(iter(pool.actor_pids.items()))
            assert pid is not None
            attempts = [asyncio.ensure_future(pool.run_attempt(_sibling(g, i)))
                        for g in range(8) for i in range(4)]  # fmt: skip
            # Once the first batch is back, the others are running or queued.
            await asyncio.wait(attempts, return_when=asyncio.FIRST_COMPLETED)
            os.kill(pid, signal.SIGKILL)
            results = await asyncio.gather(*attempts, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            assert failed, "the kill landed after every batch had finished"
            assert all(isinstance(f, GateAttemptError) and f.kind is FailureKind.INFRA
                       for f in failed)  # fmt: skip
            served = Counter(r.receipt["worker_id"] for r in results
                             if isinstance(r, AttemptOutcome))  # fmt: skip
            assert sum(served.values()) + len(failed) == 32
            # Restarted by Ray, given work only once it holds version 3.
            await pool.ready()
            assert pool.actor_restarts == 1, [lane.losses for lane in pool._lanes]
            assert pool.actor_pids[name] not in (None, pid)
            again = await _groups(pool, range(8, 16), 4, "r")
            assert {o.weight_version for o in again} == {3}
            assert {o.receipt["worker_id"] for o in again} == set(pool.actor_pids)
        finally:
            await pool.close()

    asyncio.run(main())


RAY_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition_ray.yaml"


def test_a_run_survives_a_killed_generation_actor_and_resumes_after_its_trainer_actor_died(
    ray_session: RaySession, model_dir: Path, tmp_path: Path
) -> None:
    config = load_run_config(
        RAY_RECIPE,
        [
            *CHAOS_OVERRIDES,
            "grpo.max_num_epochs=1",
            "trainer.warmup.steps=0",
            f"model.path={model_dir}",
            f"logging.log_dir={tmp_path / 'logs'}",
            "logging.progress=false",
            "logging.tensorboard=false",
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        ],
    )
    assert config.trainer.placement is TrainerPlacement.RAY
    prepared = prepare(config)
    assert isinstance(prepared.trainer, RayTrainer)
    killed: list[tuple[str, int, bool]] = []
    """(actor, trainer version at the kill, generating a batch then) of the actor killed."""

    def kill_actors(parts: RolloutParts, metrics: dict[str, float]) -> None:
        gate = prepared.gates[0]
        assert isinstance(gate, RayPoolGate)
        # The first actor known to be up: on a loaded machine one may report late.
        up = [(name, pid) for name, pid in gate.actor_pids.items() if pid is not None]
        if not killed and up:
            name, pid = up[0]
            mid_batch = gate.actor_running[name] > 0
            os.kill(pid, signal.SIGKILL)  # a generation actor's process, mid-run
            killed.append((name, parts.trainer_version, mid_batch))
        elif killed and parts.trainer_version >= killed[0][1] + 3:
            assert isinstance(prepared.trainer, RayTrainer)
            ray.kill(prepared.trainer.actor, no_restart=True)

    with pytest.raises(TrainerLostError, match="trainer actor died"):
        asyncio.run(train(prepared, on_step=kill_actors))
    assert killed
    # The restart (a new trainer actor) resumes from the snapshots and finishes.
    again = prepare(config)
    summary = asyncio.run(train(again))
    assert summary.trainer_version == 12
    check = check_finished_run(config)
    assert check.problems == []
    assert all(a.trained == a.expected and a.pending == 0 for a in check.epochs)
    assert check.history.restores and check.history.drops == []
    # The kill failed attempts as infra (retried elsewhere): the batch the actor was
    # generating, or one sent to it before its death was noticed. Killed between batches
    # and noticed first (a loaded machine: CI saw it once), it failed none, as it should.
    failed = [a for a in check.history.attempts if a.status is RolloutAttemptStatus.FAILED]
    assert all(killed[0][0] in (a.reason or "") for a in failed)
    if killed[0][2]:
        assert failed, "the actor was killed mid-batch, yet no attempt failed"
