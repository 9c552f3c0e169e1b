"""Messages between the controller and its trainer process (``trainer.placement: process``).

As for the generation worker (:mod:`rollvault.gates.worker_protocol`), every
message is a msgspec Struct encoded with msgpack and sent as plain bytes over a
``multiprocessing`` pipe: nothing on either side unpickles an object. Weights
travel as safetensors bytes, a step's samples as raw array bytes
(:class:`~rollvault.training.grpo_trainer.StepSamples`), checkpoint
directories as paths the controller created. Decoding is strict (tagged
unions, unknown fields rejected).
"""

from __future__ import annotations

import enum

import msgspec

from rollvault.config.schema import ModelDType
from rollvault.training.grpo_trainer import GrpoSettings, StepSamples

__all__ = [
    "CheckpointDone",
    "FailureKind",
    "GetWeights",
    "LoadCheckpoint",
    "SaveCheckpoint",
    "SetWeights",
    "StepDone",
    "Stop",
    "TrainStep",
    "TrainerCommand",
    "TrainerFailed",
    "TrainerReady",
    "TrainerReply",
    "TrainerSettings",
    "Weights",
    "decode_command",
    "decode_reply",
    "decode_settings",
    "encode",
]


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class TrainerSettings(_Message, frozen=True):
    """What the trainer process needs to start: the model directory and the GRPO settings."""

    model_path: str
    dtype: ModelDType
    pad_token_id: int
    settings: GrpoSettings
    torch_threads: int = 1


# -- commands -----------------------------------------------------------------------------------


class SetWeights(_Message, frozen=True, tag="set_weights"):
    """Replace the policy's weights (the version-0 policy the controller warmed up or loaded)."""

    weights: bytes


class TrainStep(_Message, frozen=True, tag="train_step"):
    samples: StepSamples


class GetWeights(_Message, frozen=True, tag="get_weights"):
    pass


class SaveCheckpoint(_Message, frozen=True, tag="save_checkpoint"):
    directory: str
    """An empty directory the controller created; it publishes it after the reply."""


class LoadCheckpoint(_Message, frozen=True, tag="load_checkpoint"):
    directory: str


class Stop(_Message, frozen=True, tag="stop"):
    pass


TrainerCommand = SetWeights | TrainStep | GetWeights | SaveCheckpoint | LoadCheckpoint | Stop

# -- replies ------------------------------------------------------------------------------------


class TrainerReady(_Message, frozen=True, tag="ready"):
    pid: int


class StepDone(_Message, frozen=True, tag="step_done"):
    metrics: dict[str, float]


class Weights(_Message, frozen=True, tag="weights"):
    weights: bytes


class CheckpointDone(_Message, frozen=True, tag="done"):
    """A command without a result (set weights, save or load a checkpoint) finished."""


class FailureKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    """A checkpoint is missing, damaged or does not fit (TrainerCheckpointError)."""
    BATCH = "batch"
    """A step's samples are not trainable as sent (TrainBatchError)."""
    OTHER = "other"


class TrainerFailed(_Message, frozen=True, tag="failed"):
    kind: FailureKind
    message: str


TrainerReply = TrainerReady | StepDone | Weights | CheckpointDone | TrainerFailed

_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(TrainerCommand)
_reply_decoder = msgspec.msgpack.Decoder(TrainerReply)
_settings_decoder = msgspec.msgpack.Decoder(TrainerSettings)


def encode(message: _Message) -> bytes:
    return _encoder.encode(message)


def decode_command(data: bytes) -> TrainerCommand:
    return _command_decoder.decode(data)


def decode_reply(data: bytes) -> TrainerReply:
    return _reply_decoder.decode(data)


def decode_settings(data: bytes) -> TrainerSettings:
    return _settings_decoder.decode(data)
