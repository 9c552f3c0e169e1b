"""The command loop every child process serves (generation worker, trainer process)."""

from __future__ import annotations

import multiprocessing

import msgspec
import pytest

from rollvault.gates.child_pipe import PipeMessage, serve_commands
from rollvault.gates.worker_protocol import (
    CODEC,
    LoadWeights,
    Shutdown,
    WeightsLoaded,
    WorkerCommand,
    WorkerFailed,
    WorkerReply,
)
from rollvault.training import trainer_protocol


def _execute(command: WorkerCommand) -> WorkerReply:
    assert isinstance(command, LoadWeights)
    return WeightsLoaded(version=command.version)


def _failed(message: str) -> WorkerFailed:
    return WorkerFailed(message=message)


def test_a_bad_command_is_answered_and_the_loop_goes_on_until_stop() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    parent.send_bytes(b"\xc1 not msgpack")
    parent.send_bytes(CODEC.encode(LoadWeights(version=4, weights=b"")))
    parent.send_bytes(CODEC.encode(Shutdown()))
    parent.send_bytes(CODEC.encode(LoadWeights(version=5, weights=b"")))  # after stop: unread
    serve_commands(child, CODEC, stop=Shutdown, execute=_execute, bad_command=_failed)
    first = CODEC.decode_reply(parent.recv_bytes())
    assert isinstance(first, WorkerFailed) and first.message.startswith("bad command: ")
    assert CODEC.decode_reply(parent.recv_bytes()) == WeightsLoaded(version=4)
    assert not parent.poll()
    assert child.poll()  # the command after the stop was left in the pipe


def test_the_loop_ends_when_the_parent_is_gone() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    parent.send_bytes(CODEC.encode(LoadWeights(version=1, weights=b"")))
    parent.close()
    # The reply cannot be sent and the next read is EOF: the loop returns, raising nothing.
    serve_commands(child, CODEC, stop=Shutdown, execute=_execute, bad_command=_failed)


def test_both_protocols_share_the_strict_message_base() -> None:
    for message in (Shutdown, trainer_protocol.Stop, trainer_protocol.TrainerReady):
        assert issubclass(message, PipeMessage)
    raw = msgspec.msgpack.encode({"type": "stop", "extra": 1})
    with pytest.raises(msgspec.ValidationError, match="extra"):
        trainer_protocol.decode_command(raw)
