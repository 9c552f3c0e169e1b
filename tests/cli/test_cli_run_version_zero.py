"""The version-0 policy, on real ``rollvault run`` processes killed before their first trainer checkpoint.

The first start warms the model up, saves the result as ``bootstrap/policy/``
before its first rollout, and is SIGKILLed at its first rollout snapshot
(``checkpointing.save_period`` is far away, so no trainer checkpoint exists).
The restart must not warm up again: its line about the policy (printed once
the policy is prepared, before the pipeline starts) says it loaded the saved
version 0, and no line says it warmed up. Its first generated weights must be
that policy: every group the restart generated at weight version 0 carries
generation logprobs equal to the saved policy's logprobs of the same tokens,
and far from those of the model before the warm-up.

A forced fresh start in the same directory deletes the old run, warms up
again and saves its own version 0 after the deletion.

The trainer runs in the controller's process (``trainer.placement=local``,
operational): each start spawns one Python fewer. That a trainer process
starts from version-0 weights other than ``model.path``'s, and hands the gate
exactly those, is ``test_training_trainer_process.py``'s subject. Every
start is forked from one process that has imported the command line, torch
and the model recipes once (``child_zygote``, ``rollvault_model_cli.py``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from child_zygote import ForkedChild
from transformers import PreTrainedModel
from zygote_slot import ROLLVAULT_MODEL_CLI, ZygoteSlot

import rollvault
from rollvault.checkpoint_tools.verify import verify_checkpoint_dir
from rollvault.controller.loop.run_logs import ATTEMPTS_LOG_FILENAME, AttemptLogRecord, read_jsonl
from rollvault.controller.snapshots.verification import read_snapshot
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.interface import TRAIN_PARTITION, train_key
from rollvault.durable.errors import SnapshotError
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.manifest_schema import read_snapshot_manifest
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.durable.trainer_checkpoints import (
    trainer_checkpoint_steps,
    verify_trainer_checkpoint,
)
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.training.logprobs import sequence_logprobs
from rollvault.training.model_store import load_model_dir

GRPO_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition.yaml"
PER_STEP, GENERATIONS, TEMPERATURE = 8, 4, 0.7
WAIT_S = 240.0
"""A hang guard for each wait, not a timing assertion."""

CLI = ZygoteSlot(ROLLVAULT_MODEL_CLI, timeout_s=WAIT_S)
_cli_zygote = CLI.module_fixture()


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--config",
        str(GRPO_RECIPE),
        f"model.path={tmp_path / 'model'}",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "trainer.warmup.steps=30",
        "dataset.num_prompts=2000",
        f"grpo.num_prompts_per_step={PER_STEP}",
        f"grpo.num_generations_per_prompt={GENERATIONS}",
        f"gate.local_model.temperature={TEMPERATURE}",
        "grpo.max_num_steps=200",
        "rollout.max_inflight_prompts=16",
        "rollout.max_buffered_rollouts=24",
        "checkpointing.save_period=100000",  # no trainer checkpoint before the kill
        "rollout_checkpointing.interval_s=0.3",
        "trainer.placement=local",  # see the module docstring
        *extra,
    ]


def _start(tmp_path: Path, stderr: Path) -> ForkedChild:
    return CLI.zygote.start(
        _args(tmp_path), os.environ, stdout=Path(os.devnull), stderr=stderr, cwd=tmp_path
    )


def _kill_when(process: ForkedChild, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    try:
        while not ready():
            assert process.poll() is None, f"the run ended (exit {process.returncode}) too early"
            assert time.monotonic() < deadline, "the run never got there"
            time.sleep(0.1)  # a poll of the run's files, not a synchronization
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL


def _bootstrap_snapshots(tmp_path: Path) -> list[Path]:
    return committed_snapshot_paths(snapshots_root(tmp_path / "ckpt" / BOOTSTRAP_DIRNAME))


class _Row:
    def __init__(self, input_ids: np.ndarray, logprobs: np.ndarray, mask: np.ndarray) -> None:
        self.input_ids, self.logprobs, self.mask = input_ids, logprobs, mask.astype(bool)


def _version_zero_rows(tmp_path: Path, incarnation: int) -> list[_Row]:
    """The rows of every group that start ``incarnation`` generated at weight version 0.

    From the newest bootstrap snapshot that can be read (the run may prune one
    while it is read); a group counts when each of its sibling's published
    attempts is logged as sealed by that start.
    """
    attempts = read_jsonl(tmp_path / "logs" / ATTEMPTS_LOG_FILENAME, AttemptLogRecord)
    mine = {
        a.gate_rollout_id
        for a in attempts
        if a.incarnation == incarnation and a.status is RolloutAttemptStatus.SEALED
    }
    for path in reversed(_bootstrap_snapshots(tmp_path)):
        try:
            snapshot = read_snapshot(
                path, read_snapshot_manifest(path), generations_per_group=GENERATIONS
            )
        except (SnapshotError, DataPlaneCheckpointError, OSError):
            continue  # pruned or replaced while it was read: an older one will do
        rows = []
        train = snapshot.data_plane.partitions.get(TRAIN_PARTITION, {})
        for entry in snapshot.replay.replay.entries:
            published = snapshot.replay.canonical_attempts[entry.group_id]
            if entry.end_weight_version != 0 or not set(published) <= mine:
                continue
            for index in range(GENERATIONS):
                row = train[train_key(entry.group_id, index)]
                rows.append(
                    _Row(
                        np.asarray(row["input_ids"]),
                        np.asarray(row["generation_logprobs"]),
                        np.asarray(row["token_mask"]),
                    )
                )
        return rows
    return []


def _largest_logprob_gap(model: PreTrainedModel, rows: list[_Row], pad_token_id: int) -> float:
    """The largest difference between a row's generation logprobs and ``model``'s."""
    recomputed = sequence_logprobs(
        model,
        [r.input_ids.tolist() for r in rows],
        temperature=TEMPERATURE,
        pad_token_id=pad_token_id,
    )
    return max(
        float(np.abs(again[row.mask] - row.logprobs[row.mask]).max())
        for row, again in zip(rows, recomputed, strict=True)
        if row.mask.any()
    )


@pytest.mark.slow
def test_a_restart_before_the_first_trainer_checkpoint_loads_the_saved_version_zero(
    tmp_path: Path,
) -> None:
    policy_dir = tmp_path / "ckpt" / BOOTSTRAP_DIRNAME / "policy"
    first = _start(tmp_path, tmp_path / "first.err")
    # Its first snapshot: the worker is barely up, so step 0 is far from complete.
    _kill_when(first, lambda: policy_dir.is_dir() and bool(_bootstrap_snapshots(tmp_path)))
    first_text = (tmp_path / "first.err").read_text()
    assert "policy: warmed up by this start (30 supervised steps" in first_text, first_text
    assert trainer_checkpoint_steps(tmp_path / "ckpt") == []
    assert verify_trainer_checkpoint(policy_dir) == []
    assert verify_checkpoint_dir(tmp_path / "ckpt").ok  # the policy beside the anchor is fine

    second = _start(tmp_path, tmp_path / "second.err")
    _kill_when(second, lambda: bool(_version_zero_rows(tmp_path, incarnation=2)))
    second_text = (tmp_path / "second.err").read_text()
    assert f"policy: version 0 loaded from {policy_dir}" in second_text, second_text
    assert "warmed up" not in second_text and "supervised steps," not in second_text
    assert trainer_checkpoint_steps(tmp_path / "ckpt") == []
    assert verify_trainer_checkpoint(policy_dir) == []  # loaded, not written again

    rows = _version_zero_rows(tmp_path, incarnation=2)
    assert rows
    saved, tokenizer = load_model_dir(policy_dir)
    before_warmup, _ = load_model_dir(tmp_path / "model")
    pad = int(tokenizer.pad_token_id)
    assert _largest_logprob_gap(saved, rows, pad) < 1e-3
    assert _largest_logprob_gap(before_warmup, rows, pad) > 0.05  # the check tells models apart
    first_rows = _version_zero_rows(tmp_path, incarnation=1)  # kept by the restore, if any
    if first_rows:
        assert _largest_logprob_gap(saved, first_rows, pad) < 1e-3

    # A forced fresh start deletes the run, then warms up and saves its own version 0.
    fresh = CLI.run(
        _args(
            tmp_path,
            "rollout_checkpointing.restore_mode=none",
            "rollout_checkpointing.force_fresh=true",
            "grpo.max_num_steps=1",
        ),
        os.environ,
        cwd=tmp_path,
    )
    assert fresh.returncode == 0, fresh.stderr
    assert "policy: warmed up by this start" in fresh.stderr
    assert verify_trainer_checkpoint(policy_dir) == []
    assert (tmp_path / "ckpt" / "final_model" / "config.json").is_file()
