"""One OpenAI-compatible vLLM server over HTTP (aiohttp): completions and the RL endpoints.

Every call sorts its failure into one of two errors, which decide who pays:

- :class:`ServerInfraError`: the connection was refused or broke, the call
  timed out, or the server answered 5xx. The server is at fault, not the
  prompt: the attempt is retried on another server, free of retry budget.
- :class:`ServerDataError`: the server answered 4xx (it refused this request)
  or an answer that is not what the endpoint documents. The request is at
  fault: the attempt fails as data and spends its retry budget.

The RL endpoints (``/pause``, ``/resume``, ``/collective_rpc``,
``/update_weight_version``, ``/weight_info``) exist only with
``VLLM_SERVER_DEV_MODE=1``. vLLM's ``--api-key`` guards ``/v1`` only, not
them: a server reachable from another machine must be firewalled or put
behind an authenticating proxy (see the README).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec

from rollvault.gates.vllm.completions import (
    MalformedCompletionError,
    SamplingSettings,
    completion_body,
    parse_completion,
)
from rollvault.gates.worker_protocol import GenerationResult

__all__ = ["PauseMode", "ServerDataError", "ServerInfraError", "VllmClient"]

PauseMode = str
"""``abort`` (drop in-flight requests), ``wait`` (let them finish) or ``keep`` (freeze them)."""


class ServerInfraError(RuntimeError):
    """The server is unreachable, timed out or failed (5xx): not the request's fault."""


class ServerDataError(ValueError):
    """The server refused the request (4xx) or gave a malformed answer."""


class _WeightInfo(msgspec.Struct, frozen=True):
    weight_version: str | None


class _ModelCard(msgspec.Struct, frozen=True):
    id: str


class _ModelList(msgspec.Struct, frozen=True):
    data: list[_ModelCard]


class VllmClient:
    """Calls one server at ``url`` (``http://host:port``); one aiohttp session, reused."""

    def __init__(
        self,
        url: str,
        *,
        model: str,
        timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- generation -----------------------------------------------------------------------

    async def complete(
        self, prompt_ids: list[int], settings: SamplingSettings, *, seed: int, request_id: int
    ) -> GenerationResult:
        """One seeded completion of ``prompt_ids``: response token ids and their logprobs."""
        body = completion_body(self.model, prompt_ids, settings, seed=seed)
        raw = await self._call("POST", "/v1/completions", json=body)
        try:
            return parse_completion(raw, request_id=request_id)
        except MalformedCompletionError as error:
            raise ServerDataError(f"{self.url}: {error}") from error

    # -- health and weights ---------------------------------------------------------------

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200 now (never raises for a down server)."""
        try:
            await self._call("GET", "/health")
        except (ServerInfraError, ServerDataError):
            return False
        return True

    async def pause(self, mode: PauseMode) -> None:
        await self._call("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self._call("POST", "/resume")

    async def reload_weights(self, weights_dir: str) -> None:
        """Load the safetensors files of ``weights_dir`` (a path the server can read)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}}
        await self._call("POST", "/collective_rpc", json=body)

    async def set_weight_version(self, version: str) -> None:
        await self._call("POST", "/update_weight_version", json={"new_version": version})

    async def served_models(self) -> list[str]:
        """The model names ``/v1/models`` lists (a completion must name one of them)."""
        raw = await self._call("GET", "/v1/models")
        try:
            return [card.id for card in msgspec.json.decode(raw, type=_ModelList).data]
        except msgspec.DecodeError as error:
            raise ServerDataError(f"{self.url}/v1/models: {error}") from error

    async def weight_version(self) -> str | None:
        """The version ``/weight_info`` reports (None before any was set)."""
        raw = await self._call("GET", "/weight_info")
        try:
            return msgspec.json.decode(raw, type=_WeightInfo).weight_version
        except msgspec.DecodeError as error:
            raise ServerDataError(f"{self.url}/weight_info: {error}") from error

    # -- transport ------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
    ) -> bytes:
        where = f"{method} {self.url}{path}"
        session = self._open_session()
        try:
            async with session.request(
                method, self.url + path, json=json, params=params, headers=self._headers
            ) as response:
                raw = await response.read()
                status = response.status
        except TimeoutError as error:
            raise ServerInfraError(f"{where}: timed out after {self._timeout.total} s") from error
        except aiohttp.ClientError as error:
            raise ServerInfraError(f"{where}: {type(error).__name__}: {error}") from error
        if status >= 500:
            raise ServerInfraError(f"{where}: HTTP {status}: {_excerpt(raw)}")
        if status >= 400:
            raise ServerDataError(f"{where}: HTTP {status}: {_excerpt(raw)}")
        return raw

    def _open_session(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session


def _excerpt(raw: bytes, limit: int = 300) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "..."
