"""A child process that serves commands over a pipe of bytes, and its parent's side.

The generation worker (:mod:`rollvault.gates.generation_worker`) and the
trainer process (:mod:`rollvault.training.trainer_process`) are both such a
child: a ``spawn`` process that decodes its settings, ignores SIGINT and
SIGTERM (only the parent knows how to stop in order, and stops it), and
serves one command at a time until told to stop or until the parent's end of
the pipe closes. Every message is a msgspec Struct (:class:`PipeMessage`)
encoded with msgpack and sent with ``Connection.send_bytes`` /
``recv_bytes``: the pipe only ever carries plain bytes, so nothing on either
side unpickles an object. Decoding is strict (tagged unions, unknown fields
rejected).

Here, the lowest layer both may import (training is above gates), is what
the two share; each protocol module keeps its own messages.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

import msgspec

__all__ = [
    "PipeCodec",
    "PipeMessage",
    "ignore_stop_signals",
    "send_reply",
    "serve_commands",
    "spawn_child",
    "stop_child",
]

CommandT = TypeVar("CommandT")
ReplyT = TypeVar("ReplyT")
SettingsT = TypeVar("SettingsT")

STOP_TIMEOUT_S = 10.0
"""How long a child is given to exit when asked before it is killed."""


class PipeMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every message on a child's pipe: frozen, keyword-only, strict."""


class PipeCodec(Generic[CommandT, ReplyT, SettingsT]):
    """The encoder and the strict decoders of one child's protocol.

    ``command`` and ``reply`` are tagged unions of :class:`PipeMessage`
    types (``Any``: a union is no ``type``); the variable holding the codec
    names the three types.
    """

    def __init__(self, command: Any, reply: Any, settings: type[SettingsT]) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._command: msgspec.msgpack.Decoder[CommandT] = msgspec.msgpack.Decoder(command)
        self._reply: msgspec.msgpack.Decoder[ReplyT] = msgspec.msgpack.Decoder(reply)
        self._settings = msgspec.msgpack.Decoder(settings)

    def encode(self, message: PipeMessage) -> bytes:
        return self._encoder.encode(message)

    def decode_command(self, data: bytes) -> CommandT:
        return self._command.decode(data)

    def decode_reply(self, data: bytes) -> ReplyT:
        return self._reply.decode(data)

    def decode_settings(self, data: bytes) -> SettingsT:
        return self._settings.decode(data)


# -- the child ----------------------------------------------------------------------------


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM in the child.

    A Ctrl-C reaches the whole process group and a scheduler (SLURM) may
    signal every process of the job, but only the parent knows how to stop
    in order (final snapshot first), and it then stops the child itself.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def serve_commands(
    connection: Connection,
    codec: PipeCodec[CommandT, ReplyT, Any],
    *,
    stop: type[PipeMessage],
    execute: Callable[[CommandT], PipeMessage],
    bad_command: Callable[[str], PipeMessage],
) -> None:
    """Serve one command at a time until ``stop`` arrives or the parent is gone.

    ``execute`` answers a command (a failure inside it is its reply, never an
    exception); a command that does not decode is answered ``bad_command``
    with why, and the loop goes on.
    """
    while True:
        try:
            raw = connection.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            command = codec.decode_command(raw)
        except msgspec.DecodeError as exc:
            reply = bad_command(f"bad command: {exc}")
        else:
            if isinstance(command, stop):
                return
            reply = execute(command)
        if not send_reply(connection, codec, reply):
            return  # the parent died while the command ran


def send_reply(connection: Connection, codec: PipeCodec[Any, Any, Any], reply: PipeMessage) -> bool:
    """Send ``reply`` to the parent; False when the parent is gone."""
    try:
        connection.send_bytes(codec.encode(reply))
    except (OSError, ValueError):
        return False
    return True


# -- the parent ---------------------------------------------------------------------------


def spawn_child(
    target: Callable[[Connection, bytes], None], settings: bytes, *, name: str
) -> tuple[BaseProcess, Connection]:
    """Start ``target(child_end, settings)`` in a ``spawn`` process; return it and our end.

    ``spawn``: no inherited torch or event-loop state. Only the child holds its
    end of the pipe, so the child's death is EOF at ours.
    """
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe(duplex=True)
    process = context.Process(target=target, args=(child_end, settings), name=name, daemon=True)
    process.start()
    child_end.close()
    return process, parent_end


def stop_child(process: BaseProcess, connection: Connection, stop: bytes) -> None:
    """Send ``stop`` (an encoded stop message), wait for the exit, kill if none; close the pipe."""
    # A child already gone (or a pipe already closed) needs no asking.
    with contextlib.suppress(OSError, ValueError):
        connection.send_bytes(stop)
    process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
    connection.close()
