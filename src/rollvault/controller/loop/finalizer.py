"""Turns a sealed prompt group into exactly N canonical training rows.

For a ``ready_to_finalize`` group the finalizer reads the staged rows each
sealed receipt names, checks them against the receipt (row present, token
count and digest as the gate reported, finite logprobs), applies the reward
checks and penalties, computes group-relative advantages and publishes one
canonical row per sibling (its turns' rows concatenated, the weight version
per token kept: -1 outside model tokens); an invalid sibling becomes a masked row, so a
group always has N rows.

Publication is one mutation section: mark finalizing, put the canonical rows,
clear the staging rows, discard the group from the ledger, add it to the
replay index. A snapshot therefore sees the group either sealed or published.
With an external data plane whose put can be interrupted, the window between
publishing and the ledger update is where ``finalization_unknown`` comes from;
restore resolves it by looking for the canonical rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from rollvault.config.schema import RewardConfig
from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.advantages import group_advantages
from rollvault.controller.loop.gate import staged_row_digest
from rollvault.controller.loop.parts import FinalizedGroup, RolloutParts
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, train_key
from rollvault.dataplane.rows import Row, RowView
from rollvault.ledger.receipts import GateReceipt, validate_receipt
from rollvault.ledger.reward_penalties import (
    CaptureRewardSettings,
    FinalizedReward,
    RewardChecks,
    RewardLogContext,
)

_ARRAY_FIELDS = ("input_ids", "generation_logprobs", "token_mask")


def capture_reward_settings(config: RewardConfig) -> CaptureRewardSettings:
    """The reward-penalty settings a sidecar records and a restore compares."""
    return CaptureRewardSettings(
        overlong_penalty=config.overlong_penalty,
        mask_overlong=config.mask_overlong,
        format_penalty=config.format_penalty,
        mask_nonfinite_logprobs=config.mask_nonfinite_logprobs,
    )


class SiblingVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """One sibling after checks: its canonical arrays and finalized reward."""

    arrays: dict[str, np.ndarray]
    reward: FinalizedReward
    problem: str | None
    correct: bool | None = None
    """The environment's verdict, from the staged rows (None: they carry none)."""


class Finalizer:
    """Finalizes sealed groups of one run (see the module docstring)."""

    def __init__(self, parts: RolloutParts, *, end_weight_version: dict[str, int]) -> None:
        self._parts = parts
        self._config = parts.config.reward
        self._settings = capture_reward_settings(parts.config.reward)
        self._end_weight_version = end_weight_version

    async def finalize(self, group_id: str) -> ReplayEntry:
        """Publish the canonical rows of a sealed group and index it for training."""
        parts = self._parts
        inputs = parts.ledger.finalization_inputs(group_id)
        _, gate_rollout_ids, receipts, rewards, masks, checks, contexts = inputs
        # Each receipt is checked and typed once here (the ledger checked it at the seal).
        typed = [validate_receipt(r) for r in receipts]
        keys_per_sibling = [list(t.staging_keys) for t in typed]
        staged = await self._staged_rows(keys_per_sibling)
        verdicts = [
            self._judge(
                typed[i],
                keys_per_sibling[i],
                staged,
                rewards[i],
                masks[i],
                checks[i],
                contexts[i],
            )
            for i in range(len(receipts))
        ]
        advantages = group_advantages(
            [v.reward.reward for v in verdicts],
            [not v.reward.masked for v in verdicts],
            normalize_by_std=self._config.normalize_advantages_by_std,
            epsilon=self._config.advantage_epsilon,
        )
        canonical = {
            train_key(group_id, i): _canonical_row(v, float(advantages[i]))
            for i, v in enumerate(verdicts)
        }
        versions = [t.weight_version for t in typed]
        return await self._publish(
            group_id, canonical, verdicts, keys_per_sibling, gate_rollout_ids, versions
        )

    async def _staged_rows(self, keys_per_sibling: list[list[str]]) -> dict[str, RowView]:
        data_plane = self._parts.data_plane
        wanted = [key for keys in keys_per_sibling for key in keys]
        present = [key for key in wanted if data_plane.has(STAGING_PARTITION, key)]
        rows: dict[str, RowView] = dict(await data_plane.get(STAGING_PARTITION, present))
        return rows

    def _judge(
        self,
        receipt: GateReceipt,
        keys: list[str],
        staged: Mapping[str, RowView],
        reward: float,
        mask_sample: bool,
        checks: RewardChecks | None,
        context: RewardLogContext | None,
    ) -> SiblingVerdict:
        problem = _row_problem(receipt, keys, staged)
        arrays = (
            _concatenate([staged[key] for key in keys], _receipt_version(receipt))
            if problem is None
            else _empty_arrays()
        )
        response_length = int(arrays["token_mask"].sum())
        finite = bool(np.isfinite(arrays["generation_logprobs"]).all())
        overlong = response_length >= self._config.max_response_tokens or bool(
            checks is not None and checks.overlong
        )
        masked = (
            mask_sample
            or problem is not None
            or (overlong and self._settings.mask_overlong)
            or (not finite and self._settings.mask_nonfinite_logprobs)
        )
        adjusted = reward
        if overlong and not self._settings.mask_overlong:
            adjusted -= self._settings.overlong_penalty
        if checks is not None and not checks.format_ok:
            adjusted -= self._settings.format_penalty
        if problem is None and not finite:
            problem = "non-finite generation logprobs"
        del context  # logged with the attempt; not needed to finalize
        return SiblingVerdict(
            arrays=arrays,
            reward=FinalizedReward(raw_reward=reward, reward=adjusted, masked=masked),
            problem=problem,
            correct=None if problem is not None else _staged_correct(staged, keys),
        )

    async def _publish(
        self,
        group_id: str,
        canonical: dict[str, Row],
        verdicts: Sequence[SiblingVerdict],
        keys_per_sibling: list[list[str]],
        gate_rollout_ids: list[str],
        versions: list[int | None],
    ) -> ReplayEntry:
        parts = self._parts
        record = parts.ledger.get_group(group_id)
        origin = parts.group(group_id).origin
        # The receipts name the versions of exactly the siblings published; the
        # pump's running maximum also saw seals a prompt_group redo discarded,
        # and is all there is for receipts of older versions (no weight_version).
        tracked = self._end_weight_version.pop(group_id, record.start_weight_version)
        known = [version for version in versions if version is not None]
        generated = max(known) if len(known) == len(versions) and known else tracked
        entry = ReplayEntry(
            group_id=group_id,
            sample_id=record.prompt_id,
            epoch=origin.epoch,
            start_weight_version=record.start_weight_version,
            # Never below the start: after a restore rolled the trainer back, a
            # group admitted under a later (rolled back) version is finished
            # with older weights.
            end_weight_version=max(record.start_weight_version, generated),
            target_step=record.target_step,
        )
        finalized = FinalizedGroup.of(
            rewards=[v.reward for v in verdicts],
            metrics=_metrics(verdicts),
            gate_rollout_ids=gate_rollout_ids,
        )
        async with parts.cut.mutation():
            parts.ledger.mark_finalization_started(parts.cut, group_id)
            await parts.data_plane.put(TRAIN_PARTITION, canonical)
            await parts.data_plane.clear(
                STAGING_PARTITION, [key for keys in keys_per_sibling for key in keys]
            )
            parts.ledger.discard_group(parts.cut, group_id)
            parts.replay.add(entry)
            parts.record_finalization(group_id, finalized)
        if parts.seal_journal is not None:
            parts.seal_journal.finalized(
                group_id, target_step=record.target_step, gate_rollout_ids=gate_rollout_ids
            )
        await parts.notify()
        return entry


def _row_problem(
    receipt: GateReceipt, keys: list[str], staged: Mapping[str, RowView]
) -> str | None:
    missing = [key for key in keys if key not in staged]
    if missing:
        return f"staged rows missing: {missing}"
    digests = receipt.row_digests
    if digests is None:
        return None
    for key, expected in zip(keys, digests, strict=True):
        row = staged[key]
        length = int(np.asarray(row["token_mask"]).sum())
        if length != expected.length:
            return f"row {key!r} has {length} response tokens, receipt says {expected.length}"
        if staged_row_digest(row) != expected.digest:
            return f"row {key!r} does not match the digest in its receipt"
    return None


def _staged_correct(staged: Mapping[str, RowView], keys: list[str]) -> bool | None:
    """The verdict of the attempt's last staged row that has one (the final turn's).

    Rows staged without it (an environment that does not say, a snapshot of an
    older version) give None: the canonical row then has no ``correct``.
    """
    for key in reversed(keys):
        value = staged[key].get("correct")
        if value is not None:
            return bool(value)
    return None


def _concatenate(rows: list[RowView], version: int) -> dict[str, np.ndarray]:
    arrays = {
        name: np.concatenate([np.asarray(row[name]) for row in rows]) for name in _ARRAY_FIELDS
    }
    arrays["weight_versions"] = np.concatenate([_token_versions(row, version) for row in rows])
    return arrays


def _token_versions(row: RowView, version: int) -> np.ndarray:
    """The row's per-token weight versions (-1 outside model tokens).

    Rows staged without them (one-call gates, older snapshots) take the
    receipt's version for every model token.
    """
    versions = row.get("weight_versions")
    if isinstance(versions, np.ndarray):
        return versions.astype(np.int64)
    return np.where(np.asarray(row["token_mask"]) > 0, version, -1).astype(np.int64)


def _receipt_version(receipt: GateReceipt) -> int:
    version = receipt.weight_version
    return -1 if version is None else version


def _empty_arrays() -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros(0, dtype=np.int64),
        "generation_logprobs": np.zeros(0, dtype=np.float32),
        "token_mask": np.zeros(0, dtype=np.int8),
        "weight_versions": np.zeros(0, dtype=np.int64),
    }


def _canonical_row(verdict: SiblingVerdict, advantage: float) -> Row:
    arrays = verdict.arrays
    masked = verdict.reward.masked
    token_mask = np.zeros_like(arrays["token_mask"]) if masked else arrays["token_mask"]
    logprobs = arrays["generation_logprobs"]
    if masked:
        # A masked row contributes nothing; keep it finite so no NaN leaks into a loss.
        logprobs = np.where(np.isfinite(logprobs), logprobs, 0.0).astype(np.float32)
    advantages = np.where(token_mask > 0, advantage, 0.0).astype(np.float32)
    row: Row = {
        "input_ids": arrays["input_ids"],
        "generation_logprobs": logprobs,
        "token_mask": token_mask,
        "weight_versions": arrays["weight_versions"],
        "advantages": advantages,
        "reward": float(verdict.reward.reward),
        "sample_mask": not masked,
    }
    if verdict.correct is not None:
        row["correct"] = verdict.correct  # what the trainer's accuracy counts
    return row


def _metrics(verdicts: Sequence[SiblingVerdict]) -> dict[str, float]:
    rewards = [v.reward.reward for v in verdicts]
    return {
        "reward_mean": float(np.mean(rewards)) if rewards else math.nan,
        "masked": float(sum(v.reward.masked for v in verdicts)),
        "invalid": float(sum(v.problem is not None for v in verdicts)),
    }
