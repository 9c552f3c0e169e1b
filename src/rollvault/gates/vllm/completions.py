"""The ``/v1/completions`` call in token ids: the request body and the strict reading of the answer.

The prompt goes in as token ids and the response comes back as token ids
(``return_tokens_as_token_ids``: each logprob entry's token is ``"token_id:N"``)
with the logprob of each sampled token (``logprobs: 0``): nothing is ever
re-tokenized from text. The server must run with
``--logprobs-mode processed_logprobs``, so that a logprob is that of the
distribution the token was drawn from (after temperature, top-k and top-p),
the one the trainer recomputes; the default (raw logprobs) ignores the
temperature.

An answer that does not have this shape (no choice, a token that is not
``token_id:N``, lengths that differ, a non-number logprob) raises
:class:`MalformedCompletionError` naming what is wrong: a data failure of
the attempt, never a silently wrong row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from rollvault.gates.worker_protocol import GenerationResult

__all__ = [
    "MalformedCompletionError",
    "SamplingSettings",
    "completion_body",
    "parse_completion",
]

_TOKEN_PREFIX = "token_id:"


class MalformedCompletionError(ValueError):
    """The server's answer is not a token-id completion with one logprob per token."""


class SamplingSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the server samples (the same distribution the trainer recomputes)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    """0: off (vLLM's own spelling of off is -1)."""
    max_new_tokens: int
    stop_token_ids: list[int]


class _Logprobs(msgspec.Struct, frozen=True):
    tokens: list[str]
    token_logprobs: list[float | None]


class _Choice(msgspec.Struct, frozen=True):
    logprobs: _Logprobs | None
    finish_reason: str | None


class _Completion(msgspec.Struct, frozen=True):
    choices: list[_Choice]


_decoder = msgspec.json.Decoder(_Completion)


def completion_body(
    model: str, prompt_ids: Sequence[int], settings: SamplingSettings, *, seed: int
) -> dict[str, Any]:
    """The JSON body of one seeded, token-id completion of ``prompt_ids``."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k if settings.top_k > 0 else -1,
        "seed": seed,
        "n": 1,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        # Stop where the local gate stops (eos, the config's eos ids, end of turn),
        # and keep the stop token: it is the model's choice and is trained.
        "stop_token_ids": list(settings.stop_token_ids),
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }


def parse_completion(raw: bytes, *, request_id: int) -> GenerationResult:
    """The response tokens and logprobs of a completion answer (see the module docstring)."""
    try:
        completion = _decoder.decode(raw)
    except msgspec.DecodeError as error:
        raise MalformedCompletionError(f"completion answer: {error}") from error
    if len(completion.choices) != 1:
        raise MalformedCompletionError(
            f"completion answer: expected 1 choice, got {len(completion.choices)}"
        )
    choice = completion.choices[0]
    if choice.logprobs is None:
        raise MalformedCompletionError("completion answer: choices[0].logprobs is missing")
    tokens = [_token_id(token, index) for index, token in enumerate(choice.logprobs.tokens)]
    logprobs = choice.logprobs.token_logprobs
    if len(logprobs) != len(tokens):
        raise MalformedCompletionError(
            f"completion answer: {len(tokens)} tokens but {len(logprobs)} logprobs"
        )
    values = []
    for index, value in enumerate(logprobs):
        if value is None:
            raise MalformedCompletionError(f"completion answer: token_logprobs[{index}] is null")
        values.append(float(value))
    if choice.finish_reason not in ("stop", "length"):
        raise MalformedCompletionError(
            f"completion answer: finish_reason {choice.finish_reason!r} (expected stop or length)"
        )
    if not tokens:
        raise MalformedCompletionError("completion answer: no token was generated")
    return GenerationResult(
        request_id=request_id,
        token_ids=tokens,
        logprobs=values,
        finished=choice.finish_reason == "stop",
    )


def _token_id(token: str, index: int) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise MalformedCompletionError(
            f"completion answer: logprobs.tokens[{index}] is {token!r}, not token_id:N "
            "(is return_tokens_as_token_ids supported by this server?)"
        )
    text = token[len(_TOKEN_PREFIX) :]
    if not text.isdigit():
        raise MalformedCompletionError(
            f"completion answer: logprobs.tokens[{index}] is {token!r}, not token_id:N"
        )
    return int(text)
