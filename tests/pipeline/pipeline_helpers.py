"""Run the pipeline in-process with the simulated gate, and read its evidence."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

from rollvault.checkpoint_tools.inventory import read_snapshot_contents
from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig, SimulatedGateConfig
from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.gate import AttemptOutcome, AttemptRequest
from rollvault.controller.loop.parts import RolloutParts
from rollvault.controller.loop.pipeline import RunSummary, run
from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    DROPS_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    AttemptLogRecord,
    DropLogRecord,
    TrainLogRecord,
    read_jsonl,
)
from rollvault.controller.loop.trainer import TrainBatch
from rollvault.controller.snapshots.checkpointer import Checkpointer
from rollvault.controller.snapshots.snapshot_files import SnapshotCorruptError
from rollvault.dataplane.interface import STAGING_PARTITION, TRAIN_PARTITION, DataPlane
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.gates.episode_runner import Generation
from rollvault.gates.simulated import SimulatedGate
from rollvault.ledger.statuses import RolloutAttemptStatus
from rollvault.tasks.episodes import EpisodeSource
from rollvault.tasks.protocols import Environment, PromptDataset
from rollvault.tasks.registry import build_dataset
from rollvault.tasks.synthetic.environment import ParityEnvironment
from rollvault.training.recording import RecordingTrainer


class BatchKeepingTrainer(RecordingTrainer):
    """Also keeps each batch's replay entries, to check staleness.

    ``wait_before_step``: (step, event): that step waits for the event first.
    """

    def __init__(self, *, wait_before_step: tuple[int | None, asyncio.Event] | None = None) -> None:
        super().__init__()
        self.entries: list[tuple[int, ReplayEntry]] = []
        self._wait = wait_before_step

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if self._wait is not None and self._wait[0] == batch.step:
            await self._wait[1].wait()
        self.entries.extend((batch.step, entry) for entry in batch.groups)
        return await super().train_step(batch)


def small_config(tmp_path: Path, *overrides: str) -> RunConfig:
    base = [
        "dataset.num_prompts=24",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_epochs=2",
        "grpo.max_num_steps=1000",
        "rollout.max_inflight_prompts=6",
        "rollout.max_buffered_rollouts=8",
        "gate.simulated.median_response_tokens=8",
        "gate.simulated.max_response_tokens=64",
        "reward.max_response_tokens=48",
        f"logging.log_dir={tmp_path / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "logging.progress=false",
    ]
    return load_run_config(None, [*base, *overrides])


def dataset_of(config: RunConfig) -> PromptDataset:
    """The run's dataset, as the recipe builds it for the simulated gate."""
    return build_dataset(
        config.dataset, vocab_size=config.gate.simulated.vocab_size, seed=config.seed
    )


def run_simulated(
    config: RunConfig,
    *,
    hang_after_groups: int | None = None,
    environment: EpisodeSource | None = None,
) -> tuple[RunSummary, BatchKeepingTrainer]:
    """Run to the end on the simulated gate.

    With ``hang_after_groups``, the gate is a :class:`HangingGate` and the last
    step waits until one of its attempts hangs: work is surely in flight when
    the run stops at its step budget.
    """
    hanging = asyncio.Event()
    last_step = config.grpo.max_num_steps - 1 if hang_after_groups is not None else None
    trainer = BatchKeepingTrainer(wait_before_step=(last_step, hanging))

    def gate(data_plane: DataPlane) -> SimulatedGate:
        if hang_after_groups is not None:
            return HangingGate(
                config.gate.simulated,
                data_plane,
                ParityEnvironment(),
                seed=config.seed,
                groups=hang_after_groups,
                hanging=hanging,
            )
        return SimulatedGate(
            config.gate.simulated, data_plane, environment or ParityEnvironment(), seed=config.seed
        )

    async def main() -> RunSummary:
        return await run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config))

    return asyncio.run(main()), trainer


def logs(
    config: RunConfig,
) -> tuple[list[TrainLogRecord], list[DropLogRecord], list[AttemptLogRecord]]:
    log_dir = Path(config.logging.log_dir)
    return (
        read_jsonl(log_dir / TRAIN_LOG_FILENAME, TrainLogRecord),
        read_jsonl(log_dir / DROPS_LOG_FILENAME, DropLogRecord),
        read_jsonl(log_dir / ATTEMPTS_LOG_FILENAME, AttemptLogRecord),
    )


def prompt_outcomes(config: RunConfig) -> Counter[tuple[int, str]]:
    """(epoch, sample id) -> how many times it was trained or dropped."""
    trained, dropped, _ = logs(config)
    counts: Counter[tuple[int, str]] = Counter()
    for record in trained:
        counts[(record.epoch, record.sample_id)] += 1
    for drop in dropped:
        counts[(drop.epoch, drop.sample_id)] += 1
    return counts


class CrashingTrainer(BatchKeepingTrainer):
    """Raises after training ``crash_after_step``: the run dies there, like a kill."""

    def __init__(self, crash_after_step: int) -> None:
        super().__init__()
        self.crash_after_step = crash_after_step

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        metrics = await super().train_step(batch)
        if batch.step == self.crash_after_step:
            raise SimulatedCrash(f"crash after step {batch.step}")
        return metrics


class SimulatedCrash(RuntimeError):
    pass


class SnapshotWaitingTrainer(CrashingTrainer):
    """Crashes after ``crash_after_step`` only once this run has committed a rollout
    snapshot: the step waits for one, so no timing decides whether a snapshot exists."""

    def __init__(self, crash_after_step: int, committed: asyncio.Event) -> None:
        super().__init__(crash_after_step)
        self._committed = committed

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if batch.step == self.crash_after_step:
            async with asyncio.timeout(120):
                await self._committed.wait()
        return await super().train_step(batch)


class SealAfterSnapshotTrainer(BatchKeepingTrainer):
    """Trains on from ``crash_after_step`` until an attempt has sealed after the newest
    committed rollout snapshot, then crashes after that step: the crash surely finds seals
    the snapshot does not hold, however snapshots and steps fall on the machine.

    Step 1 waits for the first snapshot: the groups of the later steps are then
    generated after it (the pump runs at most a buffer and the in-flight groups
    ahead), so such a seal comes before the run ends.
    """

    def __init__(self, crash_after_step: int, attempts_log: Path) -> None:
        super().__init__()
        self._first_commit = asyncio.Event()
        self.crash_after_step = crash_after_step
        self._attempts_log = attempts_log
        self._sealed_at_commit: int | None = None
        """Sealed attempts logged when the newest snapshot committed (None: none yet)."""

    def snapshot_committed(self) -> None:
        # Counted once the commit returned, so at or after its cut: a seal beyond this
        # count is surely after the snapshot.
        self._sealed_at_commit = _sealed_attempts(self._attempts_log)
        self._first_commit.set()

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if batch.step == 1:
            async with asyncio.timeout(120):
                await self._first_commit.wait()
        metrics = await super().train_step(batch)
        # No await between the check and the raise: no snapshot can commit in between.
        if (
            batch.step >= self.crash_after_step
            and self._sealed_at_commit is not None
            and _sealed_attempts(self._attempts_log) > self._sealed_at_commit
        ):
            raise SimulatedCrash(f"crash after step {batch.step}")
        return metrics


def _sealed_attempts(attempts_log: Path) -> int:
    records = read_jsonl(attempts_log, AttemptLogRecord)
    return sum(1 for record in records if record.status is RolloutAttemptStatus.SEALED)


@contextlib.contextmanager
def _on_committed_snapshots(callback: Callable[[], object]) -> Iterator[None]:
    """Call ``callback`` whenever a periodic rollout snapshot of this process commits."""
    original = Checkpointer.snapshot_if_changed

    async def snapshot_if_changed(self: Checkpointer) -> Path | None:
        path = await original(self)
        if path is not None:
            callback()
        return path

    with mock.patch.object(Checkpointer, "snapshot_if_changed", snapshot_if_changed):
        yield


def run_until_crash(
    config: RunConfig,
    crash_after_step: int,
    *,
    after_snapshot: bool = True,
    environment: EpisodeSource | None = None,
) -> None:
    """Run ``config`` and let it die after ``crash_after_step``.

    With ``after_snapshot`` (the default), that step first waits until the run
    committed a rollout snapshot of its own, so the next restore surely finds one
    written by this run however loaded the machine is; tests of a crash before any
    snapshot pass False.
    """
    committed = asyncio.Event()
    trainer = (
        SnapshotWaitingTrainer(crash_after_step, committed)
        if after_snapshot
        else CrashingTrainer(crash_after_step)
    )
    _run_to_crash(config, crash_after_step, trainer, committed.set, environment)


def run_until_crash_past_snapshot(config: RunConfig, crash_after_step: int) -> None:
    """Run ``config`` and let it die after the first step from ``crash_after_step`` on at
    which an attempt has sealed after the newest committed snapshot
    (:class:`SealAfterSnapshotTrainer`)."""
    attempts_log = Path(config.logging.log_dir) / ATTEMPTS_LOG_FILENAME
    trainer = SealAfterSnapshotTrainer(crash_after_step, attempts_log)
    _run_to_crash(config, crash_after_step, trainer, trainer.snapshot_committed, None)


def _run_to_crash(
    config: RunConfig,
    crash_after_step: int,
    trainer: BatchKeepingTrainer,
    on_commit: Callable[[], object],
    environment: EpisodeSource | None,
) -> None:
    def gate(data_plane: DataPlane) -> SimulatedGate:
        return SimulatedGate(
            config.gate.simulated, data_plane, environment or ParityEnvironment(), seed=config.seed
        )

    crashed = False
    try:
        with _on_committed_snapshots(on_commit):
            asyncio.run(run(config, gate_factory=gate, trainer=trainer, dataset=dataset_of(config)))
    except* SimulatedCrash:
        crashed = True
    assert crashed, f"the run finished without crashing (from step {crash_after_step} on)"


class HoldingGate(SimulatedGate):
    """Holds the last sibling of every group after the first ``groups`` until ``release``
    is set: the other siblings of those groups are sealed, their rows staged."""

    def __init__(
        self,
        config: SimulatedGateConfig,
        data_plane: DataPlane,
        environment: Environment,
        *,
        seed: int = 0,
        groups: int,
        held_index: int,
        release: asyncio.Event,
    ) -> None:
        super().__init__(config, data_plane, environment, seed=seed)
        self._groups = groups
        self._held_index = held_index
        self._release = release
        self._seen: list[str] = []

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        if request.group_id not in self._seen:
            self._seen.append(request.group_id)
        late = self._seen.index(request.group_id) >= self._groups
        if late and request.generation_index == self._held_index:
            await self._release.wait()
        return await super().run_attempt(request)


class RowsAtCheckpointTrainer(CrashingTrainer):
    """Before the step that the first trainer checkpoint follows, waits until the data
    plane holds staged rows and the train rows of at least one group beyond that step."""

    def __init__(
        self, crash_after_step: int, *, checkpoint_after_step: int, generations: int
    ) -> None:
        super().__init__(crash_after_step)
        self.checkpoint_after_step = checkpoint_after_step
        self.generations = generations
        self.data_plane: DataPlane | None = None

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if batch.step == self.checkpoint_after_step:
            # Trained rows stay until the checkpoint: steps 0..k's groups and one more.
            wanted = (batch.step + 1) * len(batch.groups) * self.generations + self.generations
            async with asyncio.timeout(60):
                while not self._holds_rows(wanted):
                    # A poll of the data plane with the deadline above: no event marks a
                    # count of rows.
                    await asyncio.sleep(0.005)
        return await super().train_step(batch)

    def _holds_rows(self, train_rows: int) -> bool:
        plane = self.data_plane
        assert plane is not None
        return (
            len(plane.keys(STAGING_PARTITION)) > 0
            and len(plane.keys(TRAIN_PARTITION)) >= train_rows
        )


def run_until_crash_holding_rows(config: RunConfig, crash_after_step: int) -> None:
    """Like :func:`run_until_crash`, but the first trainer checkpoint's rollout state surely
    holds rows of both partitions: staged rows of groups whose last sibling is held, and
    the rows of a finalized group not yet trained (no timing decides it)."""
    period = config.checkpointing.save_period
    generations = config.grpo.num_generations_per_prompt
    trainer = RowsAtCheckpointTrainer(
        crash_after_step, checkpoint_after_step=period - 1, generations=generations
    )
    release = asyncio.Event()
    per_step = config.grpo.num_prompts_per_step

    def gate(data_plane: DataPlane) -> SimulatedGate:
        trainer.data_plane = data_plane
        return HoldingGate(
            config.gate.simulated,
            data_plane,
            ParityEnvironment(),
            seed=config.seed,
            groups=period * per_step + 1,
            held_index=generations - 1,
            release=release,
        )

    def on_step(parts: RolloutParts, metrics: dict[str, float]) -> None:
        if parts.trainer_version >= period:
            release.set()  # the checkpoint is taken: let the held groups finish

    crashed = False
    try:
        asyncio.run(
            run(
                config,
                gate_factory=gate,
                trainer=trainer,
                dataset=dataset_of(config),
                on_step=on_step,
            )
        )
    except* SimulatedCrash:
        crashed = True
    assert crashed, f"the run finished before step {crash_after_step}"


def expected_prompts(num_prompts: int, epochs: int) -> set[tuple[int, str]]:
    return {(epoch, str(idx)) for epoch in range(epochs) for idx in range(num_prompts)}


class StallingGate(SimulatedGate):
    """Never finishes attempts of one sibling slot: a stuck worker, deterministic.

    ``after_turns``: the stuck attempts commit turns first and hang before their
    seal: a one-turn episode is run whole and the attempt hangs before it returns;
    a longer one hangs in its second model call, its first turn committed.
    """

    def __init__(
        self,
        config: SimulatedGateConfig,
        data_plane: DataPlane,
        environment: EpisodeSource,
        *,
        seed: int = 0,
        stalled_index: int,
        after_turns: bool = False,
    ) -> None:
        super().__init__(config, data_plane, environment, seed=seed)
        self._stalled_index = stalled_index
        self._after_turns = after_turns

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        if request.generation_index != self._stalled_index:
            return await super().run_attempt(request)
        if self._after_turns:
            await super().run_attempt(request)
        await asyncio.Event().wait()  # never set: the attempt hangs until cancelled
        raise AssertionError("unreachable")

    async def _generate(self, rollout_id: str, prompt_ids: list[int], turn: int) -> Generation:
        index = int(rollout_id.rsplit("_a", 1)[0].rsplit("_g", 1)[1])
        if self._after_turns and turn > 0 and index == self._stalled_index:
            await asyncio.Event().wait()  # its first turn is committed: hang in the second
        return await super()._generate(rollout_id, prompt_ids, turn)


class HangingGate(SimulatedGate):
    """Finishes the attempts of the first ``groups`` groups it sees; every attempt of a
    later group hangs until cancelled (work surely in flight when the run stops)."""

    def __init__(
        self,
        config: SimulatedGateConfig,
        data_plane: DataPlane,
        environment: Environment,
        *,
        seed: int = 0,
        groups: int,
        hanging: asyncio.Event,
    ) -> None:
        super().__init__(config, data_plane, environment, seed=seed)
        self._groups = groups
        self._seen: list[str] = []
        self._hanging = hanging
        """Set when the first attempt starts hanging."""

    async def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        if request.group_id not in self._seen:
            self._seen.append(request.group_id)
        if self._seen.index(request.group_id) >= self._groups:
            self._hanging.set()
            await asyncio.Event().wait()  # never set: the attempt hangs until cancelled
        return await super().run_attempt(request)


def run_stalled_then_kill(
    config: RunConfig,
    *,
    stalled_index: int,
    timeout_s: float = 60.0,
    after_turns: bool = False,
    environment: EpisodeSource | None = None,
) -> None:
    """Run with one sibling slot stuck until a committed snapshot holds the stuck state,
    then cancel the run.

    The stuck state: ``max_inflight_prompts`` groups in flight, each with every
    sibling sealed but the stalled one (with ``after_turns``, its turn committed). Waiting for that snapshot, not for a
    fixed time, keeps the callers' counts exact on a loaded machine (on a slow
    one the very first snapshot may already hold it).
    """
    inflight = config.rollout.max_inflight_prompts
    generations = config.grpo.num_generations_per_prompt
    snapshots = snapshots_root(Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME)

    def gate(data_plane: DataPlane) -> SimulatedGate:
        return StallingGate(
            config.gate.simulated,
            data_plane,
            environment or ParityEnvironment(),
            seed=config.seed,
            stalled_index=stalled_index,
            after_turns=after_turns,
        )

    def stuck_snapshot_committed() -> bool:
        committed = committed_snapshot_paths(snapshots)
        for path in reversed(committed):
            try:
                siblings = read_snapshot_contents(path).siblings
            except (OSError, SnapshotCorruptError):
                continue  # pruned while it was being read: look at an older one
            # With after_turns, the stuck attempts' turns must be committed too: a
            # snapshot cut after the other siblings sealed but before the stalled one
            # committed its turn holds them dispatched without one.
            stuck = siblings.mid_episode == inflight if after_turns else True
            return (
                stuck
                and siblings.in_flight == inflight
                and siblings.sealed == inflight * (generations - 1)
            )
        return False

    async def main() -> None:
        run_task = asyncio.create_task(
            run(config, gate_factory=gate, trainer=RecordingTrainer(), dataset=dataset_of(config))
        )
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            while not await asyncio.to_thread(stuck_snapshot_committed):
                if run_task.done() or asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(
                        f"no snapshot held the stuck state within {timeout_s} s "
                        f"(run ended: {run_task.done()})"
                    )
                await asyncio.sleep(0.02)  # a poll of the disk, not a synchronization
        finally:
            run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run_task

    asyncio.run(main())
