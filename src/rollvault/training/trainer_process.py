"""The GRPO trainer in a process of its own (``trainer.placement: process``).

Why: with the trainer in the controller's process, its forward and backward
passes share one GIL with the event loop that dispatches, seals and finalizes
the next step's attempts (about 1 ms of Python per attempt); each torch op
must win the GIL back, so neither the trainer nor the controller keeps a core
busy. In a process of its own, with one torch thread, the trainer has a core,
and the controller and the generation worker share the other.

:class:`ProcessTrainer` is the controller's side, with the trainer's methods
(:class:`~rollvault.controller.loop.trainer.Trainer`, ``weights_for_gate``,
``export_policy``); :func:`trainer_main` is the process. The controller stays
the one owner of the ledger, the snapshots and the checkpoint directories: it
sends each step's samples (:func:`~rollvault.training.grpo_trainer.step_samples`,
taken from the batch here, so no row crosses), and the paths of the
checkpoint directories it creates and publishes; the process reads and
writes only inside those. Transport as for the generation worker: msgpack
bytes over a pipe (:mod:`rollvault.training.trainer_protocol`).

Crash safety: the process holds no state the controller's checkpoints do not
have (weights, optimizer state and step count are in every trainer
checkpoint). It exits when told to, or when the controller's end of the pipe
closes: if the controller is killed, even by SIGKILL, the process sees EOF
at its next read (at the latest when the step it runs ends) and exits, so it
never outlives the run. It ignores SIGINT and SIGTERM, as the generation
worker does: only the controller knows how to stop in order (final snapshot
first). A process that dies is not restarted (its optimizer state since the
last checkpoint is gone): every later call raises
:class:`~rollvault.controller.loop.trainer.TrainerLostError`, which ends the
run; the next start resumes from the snapshots and the newest trainer
checkpoint.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import torch
from safetensors.torch import load as load_safetensors
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelDType
from rollvault.controller.loop.trainer import (
    TrainBatch,
    TrainBatchError,
    TrainerCheckpointError,
    TrainerLostError,
)
from rollvault.gates.child_pipe import (
    ignore_stop_signals,
    send_reply,
    serve_commands,
    spawn_child,
    stop_child,
)
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer, step_samples
from rollvault.training.model_store import load_model_dir
from rollvault.training.trainer_protocol import (
    CODEC,
    CheckpointDone,
    FailureKind,
    GetWeights,
    LoadCheckpoint,
    SaveCheckpoint,
    SetWeights,
    StepDone,
    Stop,
    TrainerCommand,
    TrainerFailed,
    TrainerReady,
    TrainerReply,
    TrainerSettings,
    TrainStep,
    Weights,
    decode_reply,
    decode_settings,
    encode,
)

__all__ = ["PROCESS_NAME", "ProcessTrainer", "trainer_main"]

_PR_SET_NAME = 15
PROCESS_NAME = "rollvault-train"
"""The trainer process's name (``/proc/<pid>/comm``), by which tools tell it apart."""


# -- the process --------------------------------------------------------------------------------


def trainer_main(connection: Connection, settings_bytes: bytes) -> None:
    """Process entry point: build the trainer, report ready, serve commands until told to stop."""
    ignore_stop_signals()
    _name_process(PROCESS_NAME)
    settings = decode_settings(settings_bytes)
    torch.set_num_threads(settings.torch_threads)
    try:
        model, _ = load_model_dir(Path(settings.model_path), dtype=settings.dtype)
        trainer = GrpoTrainer(model, pad_token_id=settings.pad_token_id, settings=settings.settings)
    except Exception as exc:  # noqa: BLE001 - reported to the controller, which raises it
        failed = TrainerFailed(kind=FailureKind.OTHER, message=f"cannot start: {exc!r}")
        send_reply(connection, CODEC, failed)
        return
    if not send_reply(connection, CODEC, TrainerReady(pid=os.getpid())):
        return
    serve_commands(
        connection,
        CODEC,
        stop=Stop,
        execute=lambda command: _execute(trainer, command),
        bad_command=lambda message: TrainerFailed(kind=FailureKind.OTHER, message=message),
    )


def _name_process(name: str) -> None:
    """Give the process a name of its own in ps, top and psutil (Linux; elsewhere a no-op):
    a spawned child's command line is the generation worker's too."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)  # a failure only loses the name


def _execute(trainer: GrpoTrainer, command: TrainerCommand) -> TrainerReply:
    """Run one command; a failure inside it is the reply, never an exception."""
    try:
        if isinstance(command, TrainStep):
            return StepDone(metrics=trainer.train_samples(command.samples))
        if isinstance(command, GetWeights):
            return Weights(weights=trainer.weights_for_gate())
        if isinstance(command, SetWeights):
            trainer.model.load_state_dict(load_safetensors(command.weights), strict=True)
        elif isinstance(command, SaveCheckpoint):
            trainer.save_checkpoint(Path(command.directory))
        elif isinstance(command, LoadCheckpoint):
            trainer.load_checkpoint(Path(command.directory))
        return CheckpointDone()
    except TrainerCheckpointError as exc:
        return TrainerFailed(kind=FailureKind.CHECKPOINT, message=str(exc))
    except TrainBatchError as exc:
        return TrainerFailed(kind=FailureKind.BATCH, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported to the controller, which raises it
        return TrainerFailed(kind=FailureKind.OTHER, message=f"{type(command).__name__}: {exc!r}")


# -- the controller's side ----------------------------------------------------------------------


class ProcessTrainer:
    """The controller's handle on the trainer process: the trainer's own methods.

    ``trainer`` is the controller's copy of the policy (its version-0 weights,
    warmed up or loaded): the process starts from those weights, and
    :meth:`export_policy` writes the process's current weights through it.
    """

    def __init__(
        self,
        trainer: GrpoTrainer,
        *,
        model_path: Path,
        dtype: ModelDType,
        pad_token_id: int,
        settings: GrpoSettings,
    ) -> None:
        self._local = trainer
        self._lock = threading.Lock()
        """One command at a time on the pipe (a step, a weight export, a checkpoint)."""
        start = TrainerSettings(
            model_path=str(model_path), dtype=dtype, pad_token_id=pad_token_id, settings=settings
        )
        self._process, self._connection = spawn_child(
            trainer_main, encode(start), name="rollvault-trainer"
        )
        self._ready = False
        self._closed = False
        self._initial_weights: bytes | None = trainer.weights_for_gate()
        # Before multiprocessing's own exit handler (which would wait on a daemon that
        # ignores SIGTERM): atexit runs the handlers registered last first.
        atexit.register(self.close)

    @property
    def pid(self) -> int:
        pid = self._process.pid
        if pid is None:
            raise TrainerLostError("the trainer process has no pid (never started)")
        return pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        samples = step_samples(batch)
        reply = await asyncio.to_thread(self._call, TrainStep(samples=samples))
        if not isinstance(reply, StepDone):
            raise self._unexpected(reply)
        return reply.metrics

    def weights_for_gate(self) -> bytes:
        reply = self._call(GetWeights())
        if not isinstance(reply, Weights):
            raise self._unexpected(reply)
        return reply.weights

    def export_policy(
        self, path: Path, tokenizer: PreTrainedTokenizerBase, *, with_digests: bool = False
    ) -> Path:
        """Publish the process's current policy at ``path`` (through the controller's copy)."""
        weights = self.weights_for_gate()
        self._local.model.load_state_dict(load_safetensors(weights), strict=True)
        return self._local.export_policy(path, tokenizer, with_digests=with_digests)

    def save_checkpoint(self, directory: Path) -> None:
        self._expect_done(self._call(SaveCheckpoint(directory=str(directory))))

    def load_checkpoint(self, directory: Path) -> None:
        self._expect_done(self._call(LoadCheckpoint(directory=str(directory))))

    def close(self) -> None:
        """Ask the process to exit; kill it if it does not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            stop_child(self._process, self._connection, encode(Stop()))
        atexit.unregister(self.close)

    # -- the pipe -----------------------------------------------------------------------

    def _call(self, command: TrainerCommand) -> TrainerReply:
        with self._lock:
            if self._closed:
                raise TrainerLostError("the trainer process was stopped")
            self._start()
            self._send(command)
            reply = self._receive()
        if isinstance(reply, TrainerFailed):
            raise _failure(reply, self.pid)
        return reply

    def _start(self) -> None:
        """Wait for the process to be up, then hand it the version-0 weights (once)."""
        if self._ready:
            return
        reply = self._receive()
        if not isinstance(reply, TrainerReady):
            if isinstance(reply, TrainerFailed):
                raise TrainerLostError(f"trainer process {self.pid}: {reply.message}")
            raise self._unexpected(reply)
        weights, self._initial_weights = self._initial_weights, None
        if weights is not None:
            self._send(SetWeights(weights=weights))
            reply = self._receive()
            if isinstance(reply, TrainerFailed):
                raise TrainerLostError(f"trainer process {self.pid}: {reply.message}")
        self._ready = True

    def _send(self, command: TrainerCommand) -> None:
        try:
            self._connection.send_bytes(encode(command))
        except (OSError, ValueError) as exc:
            raise self._lost(exc) from exc

    def _receive(self) -> TrainerReply:
        try:
            return decode_reply(self._connection.recv_bytes())
        except (EOFError, OSError, ValueError, msgspec.DecodeError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> TrainerLostError:
        return TrainerLostError(
            f"the trainer process {self._process.pid} is gone (exit code "
            f"{self._process.exitcode}): {exc!r}; restart the run to resume from its "
            "snapshots and newest trainer checkpoint"
        )

    def _expect_done(self, reply: TrainerReply) -> None:
        if not isinstance(reply, CheckpointDone):
            raise self._unexpected(reply)

    def _unexpected(self, reply: TrainerReply) -> TrainerLostError:
        return TrainerLostError(f"trainer process {self.pid}: unexpected reply {reply!r}")


def _failure(reply: TrainerFailed, pid: int) -> Exception:
    """The controller-side exception of a command that failed inside the process."""
    message = f"trainer process {pid}: {reply.message}"
    if reply.kind is FailureKind.CHECKPOINT:
        return TrainerCheckpointError(message)
    if reply.kind is FailureKind.BATCH:
        return TrainBatchError(message)
    return RuntimeError(message)
