"""Multi-turn episodes on the simulated gate: turn rows, turn commits, turn-level restore.

The guessing game (``dataset.kind=guess``) runs on the simulated gate: a guess
is the first generated token modulo 10, feedback is ``+``/``-`` as bytes. A
stalled turn keeps episodes in flight until a committed snapshot holds them
at a committed turn; the run is then stopped and started again, and each such
episode must continue from exactly its committed prefix: same rows, same
token history as the next call's prompt, no committed turn generated again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import numpy as np
from pipeline_helpers import BatchKeepingTrainer, dataset_of, small_config
from snapshot_versions import read_sidecar

from rollvault.checkpoint_tools.inventory import read_snapshot_contents
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.pipeline import run
from rollvault.controller.loop.run_logs import RESTORES_LOG_FILENAME, RestoreLogRecord, read_jsonl
from rollvault.controller.loop.trainer import TrainBatch
from rollvault.controller.snapshots.snapshot_files import ENV_ROLLOUTS_FILENAME, segments_dir_for
from rollvault.controller.snapshots.verification import (
    ProblemKind,
    VerificationLevel,
    verify_snapshot,
)
from rollvault.dataplane.checkpoint_format import (
    decode_envelope,
    replace_user_metadata,
    sha256_hex,
)
from rollvault.dataplane.interface import STAGING_PARTITION, DataPlane
from rollvault.dataplane.rows import RowView
from rollvault.dataplane.segmented import read_any_checkpoint
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.gates.episode_runner import Generation
from rollvault.gates.simulated import SimulatedGate
from rollvault.tasks.episodes import Action, RestoreClass, StepResult, idempotency_key
from rollvault.tasks.guess.environment import GuessEnvironment

MULTITURN = (
    "dataset.kind=guess",
    "gate.simulated.min_response_tokens=1",
    "gate.simulated.median_response_tokens=3",
    "gate.simulated.max_response_tokens=8",
    "reward.max_response_tokens=64",
    "rollout_checkpointing.interval_s=0.05",
    "checkpointing.save_period=1000",
)


def multiturn_config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, *MULTITURN, *overrides)


class ReplayedGuess(GuessEnvironment):
    """The game as a replayable environment; records every step's idempotency key."""

    restore_class = RestoreClass.REPLAYABLE
    keys: ClassVar[list[str]] = []

    async def step(self, action: Action, *, idempotency_key: str) -> StepResult:
        ReplayedGuess.keys.append(idempotency_key)
        return await super().step(action, idempotency_key=idempotency_key)


class RestartedGuess(GuessEnvironment):
    restore_class = RestoreClass.RESTART_ONLY


class RecordingGate(SimulatedGate):
    """Records every model call: (logical rollout id, turn, prompt ids); may stall turns.

    ``stall_turn``: siblings ``stall_index`` (every sibling when None) hang at that turn
    until cancelled.
    """

    def __init__(
        self,
        config: RunConfig,
        data_plane: DataPlane,
        *,
        stall_turn: int | None = None,
        stall_index: int | None = 0,
        environment: type[GuessEnvironment] = GuessEnvironment,
    ) -> None:
        super().__init__(config.gate.simulated, data_plane, environment, seed=config.seed)
        self.calls: list[tuple[str, str, int, list[int]]] = []
        self._stall = stall_turn
        self._stall_index = stall_index

    async def _generate(self, rollout_id: str, prompt_ids: list[int], turn: int) -> Generation:
        logical = rollout_id.rsplit("_a", 1)[0]
        stalled = self._stall_index is None or logical.endswith(f"_g{self._stall_index}")
        if turn == self._stall and stalled:
            await asyncio.Event().wait()  # hangs until the run is cancelled
        self.calls.append((logical, rollout_id, turn, list(prompt_ids)))
        return await super()._generate(rollout_id, prompt_ids, turn)


class RowKeepingTrainer(BatchKeepingTrainer):
    """Also keeps each batch's canonical rows."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[dict[str, RowView]] = []

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append(dict(batch.rows))
        return await super().train_step(batch)


def test_a_multi_turn_run_trains_every_episode_once_with_observations_masked(
    tmp_path: Path,
) -> None:
    config = multiturn_config(tmp_path, "grpo.max_num_epochs=1")
    gates: list[RecordingGate] = []
    trainer = RowKeepingTrainer()

    def gate(data_plane: DataPlane) -> RecordingGate:
        gates.append(RecordingGate(config, data_plane))
        return gates[-1]

    asyncio.run(run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config)))
    trained = [entry.sample_id for _, entry in trainer.entries]
    assert sorted(trained, key=int) == [str(i) for i in range(config.dataset.num_prompts)]
    turns = defaultdict(list)
    for logical, _, turn, _ in gates[0].calls:
        turns[logical].append(turn)
    assert max(len(t) for t in turns.values()) > 1, "some episode must take several turns"
    assert all(t == list(range(len(t))) for t in turns.values()), "turns run in order, once"
    # Sealed episodes' rows: the loss mask covers exactly the generated tokens; the
    # tokens outside it are the feedback ("+" or "-", one byte each, between turns).
    vocab = config.gate.simulated.vocab_size
    feedback = {ord("+") % vocab, ord("-") % vocab}
    final = {logical: turns for logical, turns in turns.items()}
    checked = 0
    for rows in trainer.batches:
        for key, row in rows.items():
            if not row["sample_mask"]:
                continue
            ids, mask = np.asarray(row["input_ids"]), np.asarray(row["token_mask"])
            assert set(ids[mask == 0].tolist()) <= feedback, key
            assert int((mask == 0).sum()) == len(final[key]) - 1, key
            checked += 1
    assert checked > 0


def _newest_with_episodes(root: Path, at_least: int) -> Path | None:
    for path in reversed(committed_snapshot_paths(root)):
        try:
            episodes = json.loads((path / ENV_ROLLOUTS_FILENAME).read_bytes())["episodes"]
        except (OSError, ValueError):
            continue
        if len(episodes) >= at_least:
            return path
        return None
    return None


def _stop_when_episodes_in_flight(
    config: RunConfig,
    *,
    at_least: int,
    environment: type[GuessEnvironment] = GuessEnvironment,
) -> RecordingGate:
    """Run with every sibling stalled at turn 1 until a snapshot holds episodes in flight.

    Every sibling, not some: an episode the snapshot holds at a committed turn must not
    seal before the run is cancelled, or the seal journal's record of it (replayed on
    restore) makes it sealed rather than resumed, and the snapshot no longer says what
    the restore resumes.
    """
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    gates: list[RecordingGate] = []

    def gate(data_plane: DataPlane) -> RecordingGate:
        gates.append(
            RecordingGate(
                config, data_plane, stall_turn=1, stall_index=None, environment=environment
            )
        )
        return gates[-1]

    async def main() -> None:
        task = asyncio.create_task(
            run(
                config, gate_factory=gate, trainer=BatchKeepingTrainer(), dataset=dataset_of(config)
            )
        )
        deadline = asyncio.get_running_loop().time() + 60.0
        try:
            while await asyncio.to_thread(_newest_with_episodes, root, at_least) is None:
                assert not task.done(), "the run ended before episodes were in flight"
                assert asyncio.get_running_loop().time() < deadline, "no snapshot held episodes"
                await asyncio.sleep(0.02)  # a poll of the disk, not a synchronization
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    return gates[0]


def _committed_prefixes(snapshot: Path) -> dict[str, list[np.ndarray]]:
    """Per logical rollout id with committed turns in flight: its turn rows' input ids."""
    ledger = read_sidecar(snapshot)["ledger"]  # version 6: the records from ledger segments
    loaded = read_any_checkpoint(snapshot / "data_plane", segments_dir_for(snapshot))
    rows = loaded.checkpoint.partitions[STAGING_PARTITION]
    prefixes = {}
    for group in ledger["groups"]:
        for sibling in group["siblings"]:
            attempt = sibling["attempts"][-1]
            if attempt["status"] in ("reserved", "dispatched") and attempt["turn_keys"]:
                logical = f"{group['group_id']}_g{sibling['generation_index']}"
                prefixes[logical] = [np.asarray(rows[k]["input_ids"]) for k in attempt["turn_keys"]]
    return prefixes


def test_a_restart_continues_each_interrupted_episode_at_its_last_committed_turn(
    tmp_path: Path,
) -> None:
    config = multiturn_config(tmp_path, "grpo.max_num_epochs=1")
    first = _stop_when_episodes_in_flight(config, at_least=2)
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    newest = committed_snapshot_paths(root)[-1]
    prefixes = _committed_prefixes(newest)
    assert len(prefixes) >= 2
    generated_before = {(logical, turn) for logical, _, turn, _ in first.calls}

    gates: list[RecordingGate] = []
    trainer = RowKeepingTrainer()

    def gate(data_plane: DataPlane) -> RecordingGate:
        gates.append(RecordingGate(config, data_plane))
        return gates[-1]

    asyncio.run(run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config)))
    restore = read_jsonl(Path(config.logging.log_dir) / RESTORES_LOG_FILENAME, RestoreLogRecord)[-1]
    assert sorted(restore.episodes_resumed) == sorted(prefixes)
    assert restore.turns_resumed == sum(len(rows) for rows in prefixes.values())
    assert restore.episodes_restarted == []
    calls = gates[0].calls
    for logical, rows in prefixes.items():
        history = np.concatenate(rows).tolist()
        mine = [(turn, prompt) for name, _, turn, prompt in calls if name == logical]
        # No committed turn is generated again; the next call's prompt is the committed
        # token history itself (token ids from the snapshot's rows, never re-tokenized).
        assert all(turn >= len(rows) for turn, _ in mine), (logical, [t for t, _ in mine])
        assert (logical, len(rows) - 1) in generated_before
        if mine:
            assert mine[0] == (len(rows), history)
        # The trained episode starts with the committed prefix.
        group_id, index = logical.rsplit("_g", 1)
        trained = [
            batch_rows
            for batch_rows in trainer.batches
            if logical in batch_rows  # train keys are the logical rollout ids
        ]
        assert len(trained) == 1, f"{logical} trained {len(trained)} times"
        ids = np.asarray(trained[0][logical]["input_ids"]).tolist()
        assert ids[: len(history)] == history, group_id + index


def test_verify_checks_the_env_state_sidecar_and_inspect_counts_committed_turns(
    tmp_path: Path,
) -> None:
    config = multiturn_config(tmp_path, "grpo.max_num_epochs=1")
    _stop_when_episodes_in_flight(config, at_least=2)
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    newest = committed_snapshot_paths(root)[-1]
    prefixes = _committed_prefixes(newest)
    full = VerificationLevel.FULL
    assert verify_snapshot(newest, generations_per_group=4, level=full).problems == ()
    siblings = read_snapshot_contents(newest).siblings
    assert siblings.mid_episode == len(prefixes) >= 2
    assert siblings.turns_committed == sum(len(rows) for rows in prefixes.values())

    # The sidecar's revision no longer matches the ledger's committed turns: named.
    sidecar = newest / ENV_ROLLOUTS_FILENAME
    state = json.loads(sidecar.read_bytes())
    logical = sorted(state["episodes"])[0]
    state["episodes"][logical]["env_state_revision"] += 1
    data = json.dumps(state, sort_keys=True).encode()
    sidecar.write_bytes(data)
    assert any(
        p.path == sidecar
        for p in verify_snapshot(newest, generations_per_group=4, level=full).problems
    )
    advertise(newest, ENV_ROLLOUTS_FILENAME, data)
    problems = verify_snapshot(newest, generations_per_group=4, level=full).problems
    assert [(p.path, p.kind) for p in problems] == [(sidecar, ProblemKind.INCONSISTENT)]
    assert logical in problems[0].problem and "revision" in problems[0].problem

    # A flipped byte is caught by the checksum the data plane's metadata advertises.
    raw = bytearray(data)
    raw[len(raw) // 2] ^= 0x01
    sidecar.write_bytes(bytes(raw))
    problems = verify_snapshot(newest, generations_per_group=4, level=full).problems
    assert any(p.path == sidecar and p.kind is ProblemKind.DAMAGED for p in problems)


def advertise(snapshot: Path, name: str, data: bytes) -> None:
    """Make the data plane's metadata advertise ``data`` as the sidecar ``name``."""
    metadata_path = snapshot / "data_plane" / "metadata.json"
    _version, content = decode_envelope(metadata_path.read_bytes(), metadata_path)
    user_metadata = json.loads(content)["user_metadata"]
    user_metadata["sidecars"][name]["sha256"] = sha256_hex(data)
    metadata_path.write_bytes(
        replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    )


def _restart(config: RunConfig, environment: type[GuessEnvironment]) -> RecordingGate:
    gates: list[RecordingGate] = []

    def gate(data_plane: DataPlane) -> RecordingGate:
        gates.append(RecordingGate(config, data_plane, environment=environment))
        return gates[-1]

    asyncio.run(
        run(config, gate_factory=gate, trainer=BatchKeepingTrainer(), dataset=dataset_of(config))
    )
    return gates[0]


def test_a_replayable_episode_is_rebuilt_by_replaying_its_actions_under_their_keys(
    tmp_path: Path,
) -> None:
    config = multiturn_config(tmp_path, "grpo.max_num_epochs=1")
    ReplayedGuess.keys.clear()
    _stop_when_episodes_in_flight(config, at_least=2, environment=ReplayedGuess)
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    prefixes = _committed_prefixes(committed_snapshot_paths(root)[-1])
    before = list(ReplayedGuess.keys)
    ReplayedGuess.keys.clear()
    second = _restart(config, ReplayedGuess)
    restore = read_jsonl(Path(config.logging.log_dir) / RESTORES_LOG_FILENAME, RestoreLogRecord)[-1]
    assert sorted(restore.episodes_resumed) == sorted(prefixes)
    # Replaying a committed turn passes the key its first application had: an effect
    # keyed by it cannot apply twice.
    replayed = {idempotency_key(k) for keys in restore.episodes_resumed.values() for k in keys}
    assert replayed <= set(before) and replayed <= set(ReplayedGuess.keys)
    for logical, rows in prefixes.items():
        turns = [turn for name, _, turn, _ in second.calls if name == logical]
        assert all(turn >= len(rows) for turn in turns)


def test_a_restart_only_episode_restarts_from_its_first_turn_and_says_so(
    tmp_path: Path,
) -> None:
    config = multiturn_config(tmp_path, "grpo.max_num_epochs=1")
    _stop_when_episodes_in_flight(config, at_least=2, environment=RestartedGuess)
    root = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)
    prefixes = _committed_prefixes(committed_snapshot_paths(root)[-1])
    second = _restart(config, RestartedGuess)
    restore = read_jsonl(Path(config.logging.log_dir) / RESTORES_LOG_FILENAME, RestoreLogRecord)[-1]
    assert restore.episodes_resumed == {} and restore.turns_resumed == 0
    assert sorted(line.split(":")[0] for line in restore.episodes_restarted) == sorted(prefixes)
    assert all("restart_only" in line for line in restore.episodes_restarted)
    for logical in prefixes:
        turns = [turn for name, _, turn, _ in second.calls if name == logical]
        assert turns[0] == 0
