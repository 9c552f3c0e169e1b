"""What the model gates share around an episode: the tokenizer codec and the outcome.

The local model, Ray pool and vLLM gates all run their attempts through
:func:`rollvault.gates.episode_runner.run_episode`; they differ only in how a
model call is made. They show actions to the environment as text decoded with
the model's tokenizer, append observations as that tokenizer's ids
(:class:`TokenizerCodec`), and report a finished episode as the same
:class:`~rollvault.controller.loop.gate.AttemptOutcome` (:func:`episode_outcome`).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.controller.loop.gate import (
    AttemptOutcome,
    AttemptRequest,
    TurnSink,
    current_turn_sink,
)
from rollvault.dataplane.interface import DataPlane
from rollvault.gates.episode_runner import (
    EpisodeResult,
    GenerateCall,
    PrefixGenerateCall,
    run_episode,
)
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.tasks.episodes import EpisodeEnvironment, Observation

__all__ = [
    "TokenizerCodec",
    "episode_outcome",
    "logged_checks",
    "run_model_attempt",
    "turn_seed_id",
]


def turn_seed_id(rollout_id: str, turn: int) -> str:
    """What seeds a model call: turn 0 samples exactly as a one-call attempt did."""
    return rollout_id if turn == 0 else f"{rollout_id}:t{turn}"


async def run_model_attempt(
    request: AttemptRequest,
    environment: EpisodeEnvironment,
    *,
    prompt_ids: list[int],
    generate: GenerateCall,
    tokenizer: PreTrainedTokenizerBase,
    data_plane: DataPlane,
    generate_from: PrefixGenerateCall | None = None,
    sink: TurnSink | None = None,
) -> AttemptOutcome:
    """Run a model gate's attempt as an episode and report it; ``generate`` is the gate's call
    (``generate_from`` its continuation after a journaled prefix, if it has one)."""
    episode = await run_episode(
        request,
        environment,
        prompt_ids=prompt_ids,
        generate=generate,
        codec=TokenizerCodec(tokenizer),
        data_plane=data_plane,
        sink=sink if sink is not None else current_turn_sink(data_plane),
        generate_from=generate_from,
    )
    return episode_outcome(request.gate_rollout_id, episode)


def episode_outcome(rollout_id: str, episode: EpisodeResult) -> AttemptOutcome:
    """The outcome of a finished episode: receipt of its turn rows, reward and checks."""
    return AttemptOutcome(
        receipt={
            "gate_rollout_id": rollout_id,
            "staging_keys": episode.staging_keys,
            "row_digests": episode.row_digests,
            "weight_version": episode.weight_version,
        },
        reward=episode.reward,
        reward_checks=RewardChecks(
            overlong=not episode.finished,
            format_ok=episode.format_ok,
            finite_logprobs=episode.finite_logprobs,
        ),
        reward_log_context=RewardLogContext(
            response_length=episode.last_response_length,
            stop_reason="stop" if episode.finished else "length",
        ),
        num_tokens=episode.tokens_generated,
        weight_version=episode.weight_version,
        checks=logged_checks(episode),
    )


def logged_checks(episode: EpisodeResult) -> dict[str, bool | float]:
    """What ``attempts.jsonl`` shows of an episode beside its reward."""
    checks: dict[str, bool | float] = {"format_ok": episode.format_ok}
    if episode.correct is not None:
        checks["correct"] = episode.correct
    checks.update(episode.checks)
    return checks


class TokenizerCodec:
    """Actions decoded and observations encoded with the model's tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer

    def action_text(self, generation_ids: Sequence[int], finished: bool) -> str | None:
        tokens = list(generation_ids[:-1] if finished else generation_ids)
        # Special tokens stay in the text (e.g. "<pad>"), so a response made of
        # them can never pass as well formed.
        text = self._tokenizer.decode(tokens, skip_special_tokens=False)
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}")
        return text

    def observation_ids(self, observation: Observation) -> list[int]:
        if observation.token_ids is not None:
            return list(observation.token_ids)
        if not observation.text:
            return []
        ids = self._tokenizer.encode(observation.text, add_special_tokens=False)
        return [int(token) for token in ids]
