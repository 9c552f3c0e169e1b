"""The worker pipe's messages: strict msgpack, no pickled objects."""

from __future__ import annotations

import msgspec
import pytest

from rollvault.gates.worker_protocol import (
    Generate,
    Generated,
    GenerationRequest,
    GenerationResult,
    LoadWeights,
    decode_command,
    decode_reply,
    encode,
)


def test_commands_and_replies_round_trip() -> None:
    command = Generate(
        requests=[GenerationRequest(request_id=1, prompt_ids=[3, 4], seed=9)], max_new_tokens=5
    )
    assert decode_command(encode(command)) == command
    weights = LoadWeights(version=3, weights=b"\x00\x01safetensors")
    assert decode_command(encode(weights)) == weights
    reply = Generated(
        weight_version=2,
        results=[
            GenerationResult(request_id=1, token_ids=[5, 1], logprobs=[-0.5, -0.25], finished=True)
        ],
    )
    assert decode_reply(encode(reply)) == reply


def test_unknown_fields_and_wrong_types_are_rejected_with_their_path() -> None:
    raw = msgspec.msgpack.encode(
        {
            "type": "generate",
            "requests": [{"request_id": 1, "prompt_ids": ["x"], "seed": 1}],
            "max_new_tokens": 5,
        }
    )
    with pytest.raises(msgspec.ValidationError, match=r"\$\.requests\[0\]\.prompt_ids\[0\]"):
        decode_command(raw)
    extra = msgspec.msgpack.encode(
        {"type": "load_weights", "version": 1, "weights": b"", "code": 1}
    )
    with pytest.raises(msgspec.ValidationError, match="code"):
        decode_command(extra)
    with pytest.raises(msgspec.ValidationError):
        decode_reply(
            msgspec.msgpack.encode({"type": "generate", "requests": [], "max_new_tokens": 1})
        )
