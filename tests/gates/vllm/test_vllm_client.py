"""The vLLM client and gate against a small fake server: failure kinds, parsing, routing.

The fake (an aiohttp app in this process) answers ``/v1/completions`` and the
RL endpoints like vLLM does, or fails on purpose; nothing here needs vLLM.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from aiohttp import web

import rollvault
from rollvault.config.loading import load_run_config
from rollvault.config.schema import GateKind, VllmGateConfig
from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    FailureKind,
    GateAttemptError,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.embedded import EmbeddedDataPlane
from rollvault.dataplane.interface import STAGING_PARTITION
from rollvault.gates.vllm.client import ServerDataError, ServerInfraError, VllmClient
from rollvault.gates.vllm.completions import (
    MalformedCompletionError,
    SamplingSettings,
    completion_body,
    parse_completion,
)
from rollvault.gates.vllm.fleet import WeightSyncError
from rollvault.gates.vllm.gate import VllmGate
from rollvault.gates.vllm.health import ServerHealth
from rollvault.gates.vllm.launch import _kill_leftover_group
from rollvault.gates.vllm.weight_dirs import WEIGHTS_FILENAME, WeightDirs
from rollvault.tasks.addition.environment import AdditionEnvironment
from rollvault.training.model_store import ensure_model_dir

SETTINGS = SamplingSettings(temperature=0.7, max_new_tokens=4, stop_token_ids=[1])


def _answer(tokens: list[int], finish: str = "stop") -> dict[str, Any]:
    return {
        "choices": [
            {
                "text": "",
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": [-0.5] * len(tokens),
                },
                "finish_reason": finish,
            }
        ]
    }


class FakeServer:
    """What a test wants the next completions to be; records every call."""

    def __init__(self) -> None:
        self.respond: Callable[[dict[str, Any]], web.StreamResponse] = lambda body: (
            web.json_response(_answer([5, 6, 1]))
        )
        self.delay_s = 0.0
        """How long a completion takes: the server's latency (a timeout to reach, requests
        in flight side by side), never a wait for something to happen."""
        self.hold: asyncio.Event | None = None
        """Set: every completion waits for it (requests in flight side by side, for as long
        as the test needs them there)."""
        self.model = ""
        """The model name /v1/models lists; the tests set the gate's."""
        self.health_ok = True
        self.calls: list[str] = []
        self.version = "default"
        self.reloaded: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_post("/pause", self._ok)
        app.router.add_post("/resume", self._ok)
        app.router.add_post("/collective_rpc", self._rpc)
        app.router.add_post("/update_weight_version", self._set_version)
        app.router.add_get("/weight_info", self._info)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.calls.append("complete")
        body = await request.json()
        await asyncio.sleep(self.delay_s)
        if self.hold is not None:
            await self.hold.wait()
        return self.respond(body)

    async def _ok(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(request.path)
        return web.json_response({})

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({}, status=200 if self.health_ok else 503)

    async def _rpc(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.reloaded.append(body["kwargs"]["weights_path"])
        return web.json_response({"results": [None]})

    async def _set_version(self, request: web.Request) -> web.StreamResponse:
        self.version = (await request.json())["new_version"]
        return web.json_response({"success": True})

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": [{"id": self.model}]})

    async def _info(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"weight_version": self.version})


@asynccontextmanager
async def _serving(fake: FakeServer) -> AsyncIterator[str]:
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_the_request_is_token_ids_in_token_ids_out() -> None:
    body = completion_body("m", [3, 4], SETTINGS, seed=7)
    assert body["prompt"] == [3, 4] and body["seed"] == 7 and body["n"] == 1
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 0
    assert body["top_k"] == -1  # vLLM's spelling of off
    assert body["stop_token_ids"] == [1] and body["include_stop_str_in_output"] is True


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"choices": []}, "expected 1 choice"),
        ({"choices": [{"logprobs": None, "finish_reason": "stop"}]}, "logprobs is missing"),
        (_answer([5], "abort"), "finish_reason 'abort'"),
        (_answer([]), "no token"),
        (
            {
                "choices": [
                    {
                        "logprobs": {"tokens": ["5"], "token_logprobs": [-1.0]},
                        "finish_reason": "stop",
                    }
                ]
            },
            r"tokens\[0\] is '5', not token_id:N",
        ),
        (
            {
                "choices": [
                    {
                        "logprobs": {"tokens": ["token_id:5"], "token_logprobs": []},
                        "finish_reason": "stop",
                    }
                ]
            },
            "1 tokens but 0 logprobs",
        ),
        ({"nothing": 1}, "completion answer"),
    ],
)
def test_a_malformed_answer_is_refused_naming_what_is_wrong(
    answer: dict[str, Any], message: str
) -> None:
    import json

    with pytest.raises(MalformedCompletionError, match=message):
        parse_completion(json.dumps(answer).encode(), request_id=1)


def test_failures_are_infra_for_the_server_and_data_for_the_request() -> None:
    fake = FakeServer()

    async def main() -> None:
        async with _serving(fake) as url:
            client = VllmClient(url, model="m", timeout_s=0.2)
            try:
                result = await client.complete([2], SETTINGS, seed=1, request_id=9)
                assert (result.token_ids, result.finished) == ([5, 6, 1], True)
                fake.respond = lambda body: web.json_response({"error": "x"}, status=503)
                with pytest.raises(ServerInfraError, match="HTTP 503"):
                    await client.complete([2], SETTINGS, seed=1, request_id=9)
                fake.respond = lambda body: web.json_response({"error": "bad"}, status=400)
                with pytest.raises(ServerDataError, match="HTTP 400"):
                    await client.complete([2], SETTINGS, seed=1, request_id=9)
                fake.respond = lambda body: web.json_response({"choices": []})
                with pytest.raises(ServerDataError, match="expected 1 choice"):
                    await client.complete([2], SETTINGS, seed=1, request_id=9)
                fake.respond = lambda body: web.json_response(_answer([1]))
                fake.delay_s = 0.5
                with pytest.raises(ServerInfraError, match="timed out"):
                    await client.complete([2], SETTINGS, seed=1, request_id=9)
            finally:
                await client.close()
            down = VllmClient(url.rsplit(":", 1)[0] + ":1", model="m", timeout_s=0.5)
            try:
                with pytest.raises(ServerInfraError, match="ClientConnectorError"):
                    await down.complete([2], SETTINGS, seed=1, request_id=9)
                assert not await down.healthy()
            finally:
                await down.close()

    asyncio.run(main())


def test_weight_dirs_publish_whole_versions_and_keep_the_newest(tmp_path: Path) -> None:
    dirs = WeightDirs(tmp_path / "w", keep=2)
    for version in range(4):
        path = dirs.publish(version, f"weights {version}".encode())
        assert (path / WEIGHTS_FILENAME).read_bytes() == f"weights {version}".encode()
    assert dirs.versions() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v00000002", "v00000003"]


def _request(index: int, group: str) -> AttemptRequest:
    return AttemptRequest(
        group_id=group,
        generation_index=index,
        gate_rollout_id=f"{group}_g{index}_a{index}",
        prompt={"idx": index, "prompt_text": "12+34=", "extra_env_info": {"answer": "46"}},
        weight_version=0,
    )


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Until the gate's state satisfies ``condition`` (its health checks and refits run in
    tasks of their own, which mark nothing a test could await), failing after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)  # a poll with a deadline, not a synchronization
    raise AssertionError("condition not reached")


async def _all_in_flight(
    fakes: list[FakeServer], attempts: list[Coroutine[Any, Any, AttemptOutcome]]
) -> list[int]:
    """Run ``attempts`` with every completion held at its server until all of them arrived;
    then release them. The completions each server has had, after."""
    hold = asyncio.Event()
    for fake in fakes:
        fake.hold = hold
    before = sum(f.calls.count("complete") for f in fakes)
    tasks = [asyncio.ensure_future(attempt) for attempt in attempts]
    try:
        await _until(lambda: sum(f.calls.count("complete") for f in fakes) == before + len(tasks))
    finally:
        hold.set()
        for fake in fakes:
            fake.hold = None
    await asyncio.gather(*tasks)
    return [f.calls.count("complete") for f in fakes]


@pytest.mark.slow
def test_the_gate_routes_sticky_least_loaded_and_sorts_failures(tmp_path: Path) -> None:
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    fakes = [FakeServer(), FakeServer()]
    for fake in fakes:
        fake.model = str(model_dir.resolve())

    async def main() -> None:
        async with _serving(fakes[0]) as url_a, _serving(fakes[1]) as url_b:
            config = VllmGateConfig(
                launch=False,
                urls=[url_a, url_b],
                weights_dir=str(tmp_path / "vllm"),
                request_timeout_s=2.0,
                startup_timeout_s=5.0,
            )
            data_plane = EmbeddedDataPlane(DataPlaneMutationCut())
            gate = VllmGate(
                config,
                data_plane,
                AdditionEnvironment(),
                model_path=model_dir,
                weights_provider=lambda: b"not really safetensors",
                weight_version=3,
            )
            try:
                outcome = await gate.run_attempt(_request(0, "g"))
                await _until(lambda: not gate.fleet.health.in_state(ServerHealth.STALE))
                # Both servers were refitted to version 3 before taking work.
                assert [f.version for f in fakes] == ["3", "3"]
                assert all(f.reloaded[0].endswith("v00000003") for f in fakes)
                assert outcome.weight_version == 3 and outcome.receipt["weight_version"] == 3
                staged = await data_plane.get(STAGING_PARTITION, outcome.receipt["staging_keys"])
                row = next(iter(staged.values()))
                assert (
                    np.asarray(row["input_ids"])[-3:].tolist() == [5, 6, 1]
                    and bool(row["correct"]) is False
                )
                # Siblings of a group stay on its server, even while it is busy; other
                # groups spread out. Each batch of requests is held at the servers until all
                # of it arrived, so the gate routes every request while the others are in flight.
                sticky = await _all_in_flight(
                    fakes, [gate.run_attempt(_request(i, "g")) for i in range(1, 5)]
                )
                assert sorted(sticky) == [0, 5]
                spread = await _all_in_flight(
                    fakes, [gate.run_attempt(_request(0, f"h{i}")) for i in range(4)]
                )
                assert all(after > before for after, before in zip(spread, sticky, strict=True))
                # A 4xx is the request's fault (data); a 5xx the server's (infra, suspect).
                busy = 0 if sticky[0] else 1
                fakes[busy].respond = lambda body: web.json_response({}, status=400)
                with pytest.raises(GateAttemptError) as data_error:
                    await gate.run_attempt(_request(9, "g"))
                assert data_error.value.kind is FailureKind.DATA
                fakes[busy].respond = lambda body: web.json_response({}, status=500)
                with pytest.raises(GateAttemptError) as infra_error:
                    await gate.run_attempt(_request(10, "g"))
                assert infra_error.value.kind is FailureKind.INFRA
                names = [s.name for s in gate.fleet.servers]
                # /health still answers: the suspect server is cleared again.
                await _until(lambda: gate.fleet.health.state(names[busy]) is ServerHealth.HEALTHY)
                assert gate.fleet.health.state(names[busy]) is ServerHealth.HEALTHY
                assert ServerHealth.SUSPECT in [h[3] for h in gate.fleet.health.history]
            finally:
                await gate.close()

    asyncio.run(main())


@pytest.mark.slow
def test_an_external_server_that_goes_down_is_probed_refitted_and_used_again(
    tmp_path: Path,
) -> None:
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    fake = FakeServer()
    fake.model = str(model_dir.resolve())

    async def main() -> None:
        async with _serving(fake) as url:
            config = VllmGateConfig(
                launch=False,
                urls=[url],
                weights_dir=str(tmp_path / "vllm"),
                request_timeout_s=2.0,
                startup_timeout_s=10.0,
            )
            gate = VllmGate(
                config,
                EmbeddedDataPlane(DataPlaneMutationCut()),
                AdditionEnvironment(),
                model_path=model_dir,
                weights_provider=lambda: b"weights",
            )
            name = gate.fleet.servers[0].name
            try:
                await gate.run_attempt(_request(0, "g"))
                await gate.update_weights(1)
                # Down: 5xx and no /health. The attempt fails as infra; the check finds
                # the server dead; probing finds it back; it is refitted to version 1.
                fake.health_ok = False
                fake.respond = lambda body: web.json_response({}, status=502)
                with pytest.raises(GateAttemptError) as error:
                    await gate.run_attempt(_request(1, "g"))
                assert error.value.kind is FailureKind.INFRA
                await _until(lambda: gate.fleet.health.state(name) is ServerHealth.RESTARTING)
                fake.version = "default"  # what a restarted server reports
                fake.health_ok = True
                fake.respond = lambda body: web.json_response(_answer([5, 1]))
                outcome = await gate.run_attempt(_request(2, "g"))
                assert outcome.weight_version == 1 and fake.version == "1"
                states = [to for _, _, _, to in gate.fleet.health.history]
                assert states[-5:] == [
                    ServerHealth.SUSPECT,
                    ServerHealth.DEAD,
                    ServerHealth.RESTARTING,
                    ServerHealth.STALE,
                    ServerHealth.HEALTHY,
                ]
            finally:
                await gate.close()

    asyncio.run(main())


def test_the_vllm_recipe_is_the_addition_recipe_on_the_vllm_gate() -> None:
    configs = Path(rollvault.__file__).parent / "configs"
    vllm = load_run_config(configs / "grpo_addition_vllm.yaml", [])
    local = load_run_config(configs / "grpo_addition.yaml", [])
    assert vllm.gate.kind is GateKind.VLLM and vllm.gate.vllm.launch
    sampled = ("temperature", "top_p", "top_k", "max_new_tokens")
    assert [getattr(vllm.gate.vllm, f) for f in sampled] == [
        getattr(local.gate.local_model, f) for f in sampled
    ]
    # Everything but the gate and the run's own paths is the same, so the two compare;
    # where the trainer runs is placement, not what it computes (the addition recipe
    # trains in a process of its own, the vLLM one in the controller).
    for section in ("grpo", "sampler", "rollout", "reward", "dataset"):
        assert getattr(vllm, section) == getattr(local, section), section
    placed = msgspec.structs.replace(local.trainer, placement=vllm.trainer.placement)
    assert vllm.trainer == placed


@pytest.mark.slow
def test_a_server_of_another_model_is_refused_naming_what_it_serves(tmp_path: Path) -> None:
    model_dir = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    fake = FakeServer()
    fake.model = "some/other-model"

    async def main() -> None:
        async with _serving(fake) as url:
            config = VllmGateConfig(launch=False, urls=[url], weights_dir=str(tmp_path / "v"))
            gate = VllmGate(
                config,
                EmbeddedDataPlane(DataPlaneMutationCut()),
                AdditionEnvironment(),
                model_path=model_dir,
                weights_provider=lambda: b"weights",
            )
            try:
                with pytest.raises(WeightSyncError, match=r"serves \['some/other-model'\], not"):
                    await gate.run_attempt(_request(0, "g"))
                assert fake.calls.count("complete") == 0
            finally:
                await gate.close()

    asyncio.run(main())


def test_a_killed_runs_leftover_vllm_processes_are_killed_at_the_next_start(
    tmp_path: Path,
) -> None:
    # A stand-in for an orphaned engine process: its own group, "vllm" in its command line.
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    leftover = subprocess.Popen([*sleeper, "VLLM::EngineCore"], start_new_session=True)
    other = subprocess.Popen([*sleeper, "not-a-server"], start_new_session=True)
    try:
        record = tmp_path / "server_0.log.pgid"
        record.write_text(str(leftover.pid))
        _kill_leftover_group(record)
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert not record.exists()
        record.write_text(str(other.pid))  # a group that is not vLLM's is left alone
        _kill_leftover_group(record)
        assert other.poll() is None
    finally:
        for process in (leftover, other):
            process.kill()
            process.wait()
