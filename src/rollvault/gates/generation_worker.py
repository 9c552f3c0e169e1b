"""The generation worker: a process that owns a copy of the policy and samples batches.

It runs :func:`worker_main` in a process started with the ``spawn`` context
(no inherited torch or event-loop state) and uses one torch thread, so the
trainer in the parent and the generator here each keep one core busy. It
serves one command at a time from its pipe (see
:mod:`rollvault.gates.worker_protocol`): weight updates are therefore
applied between batches, never during one, and every batch reports the
weight version that generated it.

The worker exits when told to, or when the parent's end of the pipe closes
(the parent died): it never outlives the run. It ignores SIGINT and SIGTERM:
a Ctrl-C reaches the whole process group and a scheduler (SLURM) may signal
every process of the job, but only the parent knows how to stop in order
(final snapshot first), and it then shuts the worker down itself.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from pathlib import Path

import torch
from transformers import PreTrainedModel

from rollvault.gates.causal_lm import load_causal_lm
from rollvault.gates.child_pipe import ignore_stop_signals, send_reply, serve_commands
from rollvault.gates.sampling import sample_batch
from rollvault.gates.weight_bytes import load_state_bytes
from rollvault.gates.worker_protocol import (
    CODEC,
    Generate,
    Generated,
    GenerationResult,
    LoadWeights,
    Ready,
    Shutdown,
    WeightsLoaded,
    WorkerCommand,
    WorkerFailed,
    WorkerReply,
    WorkerSettings,
    decode_settings,
)

__all__ = ["GenerationEngine", "worker_main"]


def worker_main(connection: Connection, settings_bytes: bytes) -> None:
    """Process entry point: load the model, report ready, serve commands until told to stop."""
    ignore_stop_signals()
    settings = decode_settings(settings_bytes)
    torch.set_num_threads(settings.torch_threads)
    try:
        engine = GenerationEngine(settings)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        send_reply(connection, CODEC, WorkerFailed(message=f"cannot load model: {exc!r}"))
        return
    if not send_reply(connection, CODEC, engine.ready()):
        return
    serve_commands(
        connection, CODEC, stop=Shutdown, execute=engine.execute, bad_command=_bad_command
    )


class GenerationEngine:
    """The policy copy a worker samples with, and the weight version it holds.

    The worker process above serves it over a pipe; a Ray generation actor
    (:mod:`rollvault.gates.ray_pool.actor`) hosts the same engine, so both
    generate identically and report the same replies.
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.model: PreTrainedModel = load_causal_lm(
            Path(settings.model_path), dtype=settings.dtype
        )
        self.weight_version: int | None = None
        """The weights it holds (None: the model directory's own)."""

    def ready(self) -> Ready:
        return Ready(pid=os.getpid(), dtype=str(self.model.dtype))

    def load_weights(self, command: LoadWeights) -> WeightsLoaded:
        load_state_bytes(self.model, command.weights)  # one copy, strict as load_state_dict
        self.weight_version = command.version
        return WeightsLoaded(version=command.version)

    def generate(self, command: Generate) -> Generated:
        return _generate(self.model, command, self.settings, self.weight_version)

    def execute(self, command: WorkerCommand) -> WorkerReply:
        """Run one command; a failure inside it is the reply, never an exception."""
        try:
            if isinstance(command, LoadWeights):
                return self.load_weights(command)
            if isinstance(command, Generate):
                return self.generate(command)
            raise TypeError(f"{type(command).__name__} is not executed")
        except Exception as exc:  # noqa: BLE001 - reported to the caller with the command
            return WorkerFailed(message=f"{type(command).__name__} failed: {exc!r}")


def _bad_command(message: str) -> WorkerFailed:
    return WorkerFailed(message=message)


def _generate(
    model: PreTrainedModel, command: Generate, settings: WorkerSettings, version: int | None
) -> Generated:
    requests = command.requests
    sampled = sample_batch(
        model,
        [r.prompt_ids for r in requests],
        seeds=[r.seed for r in requests],
        max_new_tokens=command.max_new_tokens,
        row_limits=[r.max_new_tokens for r in requests],
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        stop_token_ids=settings.stop_token_ids,
        pad_token_id=settings.pad_token_id,
    )
    return Generated(
        weight_version=version,
        results=[
            GenerationResult(
                request_id=request.request_id,
                token_ids=sequence.token_ids,
                logprobs=sequence.logprobs,
                finished=sequence.finished,
            )
            for request, sequence in zip(requests, sampled, strict=True)
        ],
    )
