"""The local model gate: a causal LM in a worker process, a text environment, staged rows.

An attempt renders the prompt into token ids (its ``prompt_text`` as it is,
or its ``messages`` or text through the tokenizer's chat template: see
:mod:`rollvault.gates.prompt_rendering`) and runs its episode
(:mod:`rollvault.gates.episode_runner`): each model call waits for its turn
in the next generation batch, its response is decoded (without its stop
token: see :mod:`rollvault.gates.stop_tokens`) for the environment's step,
and the observation that follows is tokenized and appended; each turn stages
one row, as :class:`~rollvault.gates.simulated.SimulatedGate` does. A
single-turn task is the one-turn episode of its text environment. The
receipt lists the turns' keys with their digests.

Batching: one dispatcher task takes every request waiting at that moment
(up to ``max_batch_size``) and sends them to the worker as one left-padded
batch. A batch ends at a group boundary: the siblings of a group (requests
with one ``group_id``) go to the worker together, unless the group alone is
larger than a batch. Weights: :meth:`LocalModelGate.update_weights` takes
the weights of the new version from the provider right away, and the
dispatcher hands them to the worker before its next batch, except while a
group has siblings generated and siblings still waiting: the worker keeps
the version it has until the group's last sibling has started (the hold), so
a group is generated with one version. A worker restarted meanwhile can
only load the newest weights; the rollout pump then finds the mixed group
(``prompt_group``) and redoes it. Each outcome reports, and its receipt
records, the version that actually generated it. Failures: if the worker
dies, the attempts of the batch it was running fail as ``FailureKind.INFRA``
(the rollout pump retries them), and the next batch starts a fresh worker
with the current weights.

Transport: each message is a msgspec Struct encoded as msgpack bytes over a
``multiprocessing`` pipe (``send_bytes``/``recv_bytes``): no pickled objects
cross it, and weights travel as safetensors bytes. The one thing
``multiprocessing`` pickles itself is the spawn call's arguments, a pipe end
and a bytes string of settings.

The worker is started with the ``spawn`` context, which re-imports the main
module in the child: a script that builds this gate must keep its top-level
work under ``if __name__ == "__main__":`` (the ``rollvault`` command does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import msgspec
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import LocalModelGateConfig, ModelDType
from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    FailureKind,
    GateAttemptError,
    PartialTurn,
    TurnSink,
    current_turn_sink,
)
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.causal_lm import load_tokenizer
from rollvault.gates.episode_runner import Generation
from rollvault.gates.group_batches import GroupBatchQueue, fail_request
from rollvault.gates.model_episodes import run_model_attempt, turn_seed_id
from rollvault.gates.prompt_ids_cache import PromptIdsCache
from rollvault.gates.prompt_rendering import PromptFormat, PromptRenderer, PromptRenderError
from rollvault.gates.stop_tokens import stop_token_ids
from rollvault.gates.worker_process import (
    WorkerCommandError,
    WorkerLostError,
    WorkerProcess,
    WorkerStartError,
)
from rollvault.gates.worker_protocol import (
    Generate,
    GenerationRequest,
    GenerationResult,
    WorkerSettings,
)
from rollvault.tasks.episodes import EpisodeSource, episode_factory

__all__ = ["GateClosedError", "LocalModelGate", "WeightsProvider"]

WeightsProvider = Callable[[], bytes]
"""Returns the trainer's current weights as safetensors bytes."""

MAX_CONSECUTIVE_WORKER_LOSSES = 3
"""A worker that keeps dying without finishing a batch is a fault, not bad luck."""


class GateClosedError(RuntimeError):
    """An attempt was started on a closed gate."""


class _Pending(msgspec.Struct):
    group_id: str
    request: GenerationRequest
    future: asyncio.Future[tuple[int, GenerationResult]]


class LocalModelGate:
    """Generates with a local model in a worker process (see the module docstring)."""

    starts_before_weights: ClassVar[bool] = True
    """The constructor starts the worker before asking the provider for the weights, so
    the worker loads its model meanwhile (a trainer in another process may still be
    starting up). A subclass whose start needs the weights sets it False."""

    def __init__(
        self,
        config: LocalModelGateConfig,
        data_plane: DataPlane,
        environment: EpisodeSource,
        *,
        model_path: Path,
        weights_provider: WeightsProvider,
        weight_version: int = 0,
        seed: int = 0,
        prompt_format: PromptFormat | None = None,
        dtype: ModelDType = ModelDType.FLOAT32,
        chunk_tokens: int | None = None,
    ) -> None:
        self._config = config
        self._chunk_tokens = chunk_tokens
        """``rollout.prefix_resume_tokens`` when prefix resume is on: a turn is generated in
        chunks of at most this many tokens, each but the last journaled as a partial."""
        self._data_plane = data_plane
        self._environment = episode_factory(environment, where="LocalModelGate")
        self._model_path = model_path
        self._provider = weights_provider
        self._seed = seed
        self._dtype = dtype
        self._tokenizer: PreTrainedTokenizerBase = load_tokenizer(model_path)
        # Both refuse a bad model directory here, before a worker starts.
        self._renderer = PromptRenderer(
            self._tokenizer, prompt_format or PromptFormat(), model_path=model_path
        )
        self._prompt_cache = PromptIdsCache()
        self.stop_token_ids = stop_token_ids(
            self._tokenizer, model_path, end_of_turn_id=self._renderer.end_of_turn_id
        )
        """Generation stops a response at the first of these."""
        self.worker_dtype: str | None = None
        """The parameter dtype the current worker reported when it loaded the model."""
        self._worker: WorkerProcess | None = None
        self._worker_ready = False
        if self.starts_before_weights:
            self.start()
        self._weights = (weight_version, weights_provider())
        if not self.starts_before_weights:
            self.start()
        self._pending: GroupBatchQueue[_Pending] = GroupBatchQueue(config.max_batch_size)
        """Groups with siblings generated and siblings still waiting: the worker keeps its
        weight version until they have all started."""
        self._wakeup = asyncio.Event()
        self._dispatcher: asyncio.Task[None] | None = None
        self._next_request_id = 0
        self._losses_in_a_row = 0
        self._closed = False
        self._fatal: WorkerStartError | None = None
        self.tokens_generated = 0
        """Response tokens of every finished generation, including attempts that failed later."""
        self.worker_restarts = 0
        self.batches = 0
        """Generation batches the worker completed."""
        self.largest_batch = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker process (it loads the model in the background). Idempotent."""
        if self._worker is None:
            self._worker = WorkerProcess(self._worker_settings())
            self._worker_ready = False

    @property
    def worker_pid(self) -> int:
        """Process id of the current worker (starting one if none is running)."""
        self.start()
        assert self._worker is not None
        return self._worker.pid

    @property
    def weight_version(self) -> int:
        """The version the next batch generates with."""
        return self._weights[0]

    async def update_weights(self, weight_version: int) -> None:
        """Take the provider's weights as ``weight_version``; the worker loads them before
        its next batch."""
        if weight_version < self._weights[0]:
            raise ValueError(
                f"LocalModelGate: weight version went back from {self._weights[0]} "
                f"to {weight_version}"
            )
        self._weights = (weight_version, await asyncio.to_thread(self._provider))

    async def close(self) -> None:
        """Stop the dispatcher and the worker; pending attempts are cancelled."""
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
        self._pending.cancel_all()
        await asyncio.to_thread(self._stop_worker)

    # -- attempts -------------------------------------------------------------------------

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        sink = current_turn_sink(self._data_plane)
        return await run_model_attempt(
            request,
            self._environment(),
            prompt_ids=self._prompt_ids(request),
            generate=lambda prompt, turn: self._call(request, sink, prompt, turn, None),
            generate_from=lambda prompt, turn, prefix: self._call(
                request, sink, prompt, turn, prefix
            ),
            tokenizer=self._tokenizer,
            data_plane=self._data_plane,
            sink=sink,
        )

    def _prompt_ids(self, request: AttemptRequest) -> list[int]:
        try:
            # Siblings share their group's prompt: it is rendered once per group.
            return self._prompt_cache.prompt_ids(
                request.group_id, request.prompt, self._renderer.prompt_ids
            )
        except PromptRenderError as error:
            raise GateAttemptError(request.gate_rollout_id, FailureKind.DATA, str(error)) from error

    async def _call(
        self,
        request: AttemptRequest,
        sink: TurnSink,
        prompt_ids: list[int],
        turn: int,
        prefix: PartialTurn | None,
    ) -> Generation:
        """One model call of an attempt (after ``prefix``, when a restore continues it).

        Without prefix resume, one generation; turn 0 samples exactly as a one-call
        attempt did. With it, chunks of at most ``chunk_tokens`` new tokens, each
        prompted with ``prompt_ids`` + the turn's tokens so far and seeded by (the
        turn's seed id, its token offset), so a continuation after a journaled prefix
        draws what the uninterrupted call would have; every chunk that does not end
        the call is handed to ``sink`` as the turn's partial output. Returns the
        tokens after ``prefix``.
        """
        rollout_id = request.gate_rollout_id
        seed_id = prefix.seed_id if prefix is not None else turn_seed_id(rollout_id, turn)
        limit = self._config.max_new_tokens
        chunk = self._chunk_tokens or limit
        so_far = _TurnTokens.of(prefix)
        start = len(so_far.token_ids)
        finished = False
        while not finished and len(so_far.token_ids) < limit:
            offset = len(so_far.token_ids)
            version, result = await self._generate(
                request.group_id,
                rollout_id,
                prompt_ids + so_far.token_ids,
                # Offset 0 keeps the one-call seed: a turn of one chunk samples as with off.
                seed_id=seed_id if offset == 0 else f"{seed_id}:o{offset}",
                max_new_tokens=min(chunk, limit - offset) if self._chunk_tokens else None,
            )
            self.tokens_generated += len(result.token_ids)
            so_far.extend(result, version)
            finished = result.finished
            if not finished and len(so_far.token_ids) < limit:
                await sink.record_partial(request, so_far.partial(turn, seed_id))
        return so_far.generation(start, finished=finished)

    async def _generate(
        self,
        group_id: str,
        rollout_id: str,
        prompt_ids: list[int],
        *,
        seed_id: str,
        max_new_tokens: int | None = None,
    ) -> tuple[int, GenerationResult]:
        if self._closed:
            raise GateClosedError(f"attempt {rollout_id} started on a closed LocalModelGate")
        if self._fatal is not None:
            raise self._fatal
        future: asyncio.Future[tuple[int, GenerationResult]] = (
            asyncio.get_running_loop().create_future()
        )
        self._next_request_id += 1
        request = GenerationRequest(
            request_id=self._next_request_id,
            prompt_ids=prompt_ids,
            seed=self._sample_seed(seed_id),
            max_new_tokens=max_new_tokens,
        )
        self._pending.append(_Pending(group_id=group_id, request=request, future=future))
        self._wakeup.set()
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="local-model-gate")
        try:
            return await future
        except WorkerLostError as error:
            raise GateAttemptError(rollout_id, FailureKind.INFRA, str(error)) from error

    def _sample_seed(self, rollout_id: str) -> int:
        digest = hashlib.sha256(f"{self._seed}:sample:{rollout_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1  # non-negative int64

    # -- the dispatcher -------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._pending:
                    batch, hold = self._pending.next_batch()
                    if batch:
                        await self._run_batch(batch, hold=hold)
        except WorkerStartError as error:
            # Not retryable: every waiting and every later attempt raises it, which
            # stops the run with the worker's own message.
            self._fatal = error
            self._pending.fail_all(error)

    async def _run_batch(self, batch: list[_Pending], *, hold: bool = False) -> None:
        command = Generate(
            requests=[pending.request for pending in batch],
            max_new_tokens=self._config.max_new_tokens,
        )
        try:
            worker = await self._ready_worker(hold=hold)
            generated = await asyncio.to_thread(worker.generate, command)
        except (WorkerLostError, WorkerCommandError) as error:
            lost = WorkerLostError(str(error))
            for pending in batch:
                fail_request(pending, lost)
            await self._retire_worker(error)
            return
        except WorkerStartError as error:
            for pending in batch:
                fail_request(pending, error)
            raise
        self._losses_in_a_row = 0
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        version = generated.weight_version
        if version is None:
            raise WorkerStartError("the generation worker generated before loading any weights")
        for pending, result in zip(batch, generated.results, strict=True):
            if not pending.future.done():  # an attempt cancelled meanwhile takes no result
                pending.future.set_result((version, result))

    async def _ready_worker(self, *, hold: bool) -> WorkerProcess:
        """The worker, started and loaded with the current weights.

        ``hold``: a group of this batch already has siblings generated, so a worker
        that has weights keeps them (a fresh worker has none to keep)."""
        self.start()
        worker = self._worker
        assert worker is not None
        if not self._worker_ready:
            ready = await asyncio.to_thread(worker.wait_ready)
            self.worker_dtype = ready.dtype
            self._worker_ready = True
        version, weights = self._weights
        keep = hold and worker.weight_version is not None
        if worker.weight_version != version and not keep:
            await asyncio.to_thread(worker.load_weights, version, weights)
        return worker

    async def _retire_worker(self, error: Exception) -> None:
        """Stop a dead or failing worker; the next batch starts a fresh one."""
        self._losses_in_a_row += 1
        worker, self._worker = self._worker, None
        if worker is not None:
            await asyncio.to_thread(worker.stop)
            self.worker_restarts += 1
        if self._losses_in_a_row > MAX_CONSECUTIVE_WORKER_LOSSES:
            raise WorkerStartError(
                f"the generation worker failed {self._losses_in_a_row} times in a row; "
                f"last: {error}"
            )

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _worker_settings(self) -> WorkerSettings:
        return WorkerSettings(
            model_path=str(self._model_path),
            temperature=self._config.temperature,
            top_p=self._config.top_p,
            top_k=self._config.top_k,
            stop_token_ids=self.stop_token_ids,
            pad_token_id=int(self._tokenizer.pad_token_id),
            dtype=self._dtype,
        )


class _TurnTokens(msgspec.Struct):
    """A turn's tokens so far, with their logprobs and per-token weight versions."""

    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]

    @classmethod
    def of(cls, prefix: PartialTurn | None) -> _TurnTokens:
        if prefix is None:
            return cls([], [], [])
        return cls(list(prefix.token_ids), list(prefix.logprobs), list(prefix.weight_versions))

    def extend(self, result: GenerationResult, version: int) -> None:
        self.token_ids.extend(result.token_ids)
        self.logprobs.extend(result.logprobs)
        self.weight_versions.extend([version] * len(result.token_ids))

    def partial(self, turn: int, seed_id: str) -> PartialTurn:
        return PartialTurn(
            turn_index=turn,
            token_ids=list(self.token_ids),
            logprobs=list(self.logprobs),
            weight_versions=list(self.weight_versions),
            seed_id=seed_id,
        )

    def generation(self, start: int, *, finished: bool) -> Generation:
        """The tokens from ``start`` on (after a resumed prefix) as one model call's output."""
        versions = self.weight_versions[start:]
        return Generation(
            token_ids=self.token_ids[start:],
            logprobs=self.logprobs[start:],
            weight_version=max(versions, default=self._newest_version()),
            finished=finished,
            weight_versions=versions if len(set(versions)) > 1 else None,
        )

    def _newest_version(self) -> int:
        return max(self.weight_versions, default=0)
