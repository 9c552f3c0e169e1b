"""One run of the asynchronous pipeline: build the parts, run both pumps.

The caller (a recipe) gives the dataset, the gate factory and the trainer;
the controller knows them only by their protocols.

The rollout pump and the train pump run concurrently in one TaskGroup on one
event loop. The run ends when the train pump has trained the step budget or
no step is left; the rollout pump is then cancelled (groups still in flight
stay in the ledger, which is what a later snapshot would keep).

A stop request (:class:`~rollvault.controller.loop.shutdown.Shutdown`, which
``rollvault run`` makes on SIGTERM or SIGINT) ends the run the same way, early
and within ``rollout_checkpointing.shutdown_grace_s`` of the request: the
rollout pump is cancelled at once, so no attempt is dispatched after it; the
periodic checkpointer finishes the snapshot it may be writing; the train pump
takes no further step; then the final rollout snapshot is written, and the
run's logs get a line in ``shutdowns.jsonl`` naming it. Attempts in flight are
not awaited: a model call can take longer than any grace period, and the
snapshot keeps them as dispatched, so a restart redoes exactly those and
reuses every sibling sealed before the stop. If the grace runs out first,
whatever is still running is cancelled and a restart resumes from the last
snapshot committed before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from rollvault.config.schema import RunConfig
from rollvault.controller.data.dataloader import PromptDataLoader
from rollvault.controller.data.replay_index import ReplayBufferIndex
from rollvault.controller.data.sampler import build_sampler
from rollvault.controller.data.shortfall import BatchShortfall, SparePrompts
from rollvault.controller.loop.capacity import ReplayCapacity
from rollvault.controller.loop.data_plane import build_data_plane, data_plane_services
from rollvault.controller.loop.dispatch_journal import DISPATCH_JOURNAL_DIRNAME, DispatchJournal
from rollvault.controller.loop.finalizer import Finalizer
from rollvault.controller.loop.gate import FailureKind, Gate
from rollvault.controller.loop.io_failures import RunStoppedByIOError, first_stop
from rollvault.controller.loop.parts import RolloutParts, RunLogs
from rollvault.controller.loop.pending import record_pending
from rollvault.controller.loop.rollout_pump import RolloutPump
from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    DROPS_LOG_FILENAME,
    INCARNATION_FILENAME,
    PENDING_LOG_FILENAME,
    RESTORES_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    TURNS_LOG_FILENAME,
    JsonlWriter,
    LogSequence,
    ShutdownLogRecord,
)
from rollvault.controller.loop.seal_journal import SealJournal
from rollvault.controller.loop.shutdown import Shutdown, record_shutdown
from rollvault.controller.loop.train_pump import TrainPump
from rollvault.controller.loop.trainer import Trainer, TrainerLostError
from rollvault.controller.snapshots.checkpointer import Checkpointer
from rollvault.controller.snapshots.restorer import RolloutRestorer
from rollvault.controller.snapshots.resume import (
    ResumeSource,
    plan_resume,
)
from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane.interface import STAGING_PARTITION, DataPlane
from rollvault.durable.fsync import atomic_write_bytes
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.tasks.protocols import PromptDataset

GateFactory = Callable[[DataPlane], Gate]
StepCallback = Callable[[RolloutParts, dict[str, float]], None]


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What one run did, for the command line's summary and for tests."""

    incarnation: int
    trainer_version: int
    trained_groups: int
    dropped_groups: int
    shortfall: dict[int, int]
    infra_failures: int
    data_failures: int
    groups_in_flight: int
    staging_rows_left: int
    snapshots_written: int
    trainer_checkpoints: int
    shutdown: ShutdownLogRecord | None = None
    """Set when a stop request ended the run early: what was kept, where to resume."""
    pending: dict[str, int] = msgspec.field(default_factory=dict)
    """Prompts of reached epochs left untrained at the end (the step budget ran out), per
    :class:`~rollvault.controller.loop.run_logs.PendingReason`; each has a ``pending.jsonl`` line."""

    @property
    def pending_prompts(self) -> int:
        """How many prompts were left pending."""
        return sum(self.pending.values())


def next_incarnation(log_dir: Path) -> int:
    """Count this start of the run: 1 for the first, +1 for each restart."""
    path = log_dir / INCARNATION_FILENAME
    previous = int(path.read_text()) if path.exists() else 0
    log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, str(previous + 1).encode())
    return previous + 1


def build_parts(config: RunConfig, *, dataset: PromptDataset) -> RolloutParts:
    """Fresh parts for a run on ``dataset``; call on the event loop that will run it."""
    log_dir = Path(config.logging.log_dir)
    incarnation = next_incarnation(log_dir)
    cut = DataPlaneMutationCut()
    sequence = LogSequence()
    return RolloutParts(
        config=config,
        cut=cut,
        ledger=RolloutRecoveryLedger(),
        data_plane=build_data_plane(config.dataplane, cut),
        dataset=dataset,
        dataloader=PromptDataLoader(dataset, shuffle=config.sampler.shuffle, seed=config.seed),
        sampler=build_sampler(
            config.sampler, num_prompts_per_step=config.grpo.num_prompts_per_step
        ),
        replay=ReplayBufferIndex(),
        shortfall=BatchShortfall(),
        spares=SparePrompts(),
        logs=RunLogs(
            train=JsonlWriter(log_dir / TRAIN_LOG_FILENAME, sequence),
            attempts=JsonlWriter(log_dir / ATTEMPTS_LOG_FILENAME, sequence),
            drops=JsonlWriter(log_dir / DROPS_LOG_FILENAME, sequence),
            restores=JsonlWriter(log_dir / RESTORES_LOG_FILENAME, sequence),
            pending=JsonlWriter(log_dir / PENDING_LOG_FILENAME, sequence),
            turns=JsonlWriter(log_dir / TURNS_LOG_FILENAME, sequence),
            sequence=sequence,
            incarnation=incarnation,
        ),
        journal=(
            DispatchJournal(Path(config.checkpointing.checkpoint_dir) / DISPATCH_JOURNAL_DIRNAME)
            if config.rollout_checkpointing.enabled
            else None
        ),
        seal_journal=(
            SealJournal.open(
                Path(config.checkpointing.checkpoint_dir), config.rollout_checkpointing.journal
            )
            if config.rollout_checkpointing.enabled and config.rollout_checkpointing.journal.enabled
            else None
        ),
    )


async def run(
    config: RunConfig,
    *,
    gate_factory: GateFactory,
    trainer: Trainer,
    dataset: PromptDataset,
    on_step: StepCallback | None = None,
    before_start: Callable[[ResumeSource | None], None] | None = None,
    shutdown: Shutdown | None = None,
) -> RunSummary:
    """Start or resume the run ``config`` describes, on ``dataset``, and run it to the end.

    ``dataset`` must be the run's (the task's dataset for ``config.dataset``):
    a restore rehydrates its prompts by index and checks their identities.
    ``before_start(resume)`` is called once the checkpoint directory holds
    this run's checked anchor (None: a fresh start), before the gate is built
    and anything is restored or generated.
    A request on ``shutdown`` ends the run early (see the module docstring).

    Raises ``IncompatibleRunError`` (config or dataset rows changed), ``RunExistsError``
    (``restore_mode=none`` on an existing run) or ``NoUsableSnapshotError``
    before anything runs, and a ``RunStoppedByIOError`` when the run stops
    on a write it could not make (snapshots failing, a trainer checkpoint, a
    log line), with everything durable before it intact.
    """
    plan = plan_resume(config, dataset=dataset)
    if before_start is not None:
        before_start(plan.resume)
    with data_plane_services(config.dataplane):
        parts = build_parts(config, dataset=dataset)
        with _long_lived_objects_frozen():
            return await run_pipeline(
                parts,
                gate_factory=gate_factory,
                trainer=trainer,
                on_step=on_step,
                resume=plan.resume,
                fingerprint=plan.fingerprint,
                shutdown=shutdown,
            )


@contextlib.contextmanager
def _long_lived_objects_frozen() -> Iterator[None]:
    """Keep what exists before the run (modules, model, dataset) out of garbage collection.

    A snapshot allocates many short-lived objects, which triggers
    collections; the older generations walk every object of the process,
    torch's and transformers' included, with the GIL held. Frozen objects are
    skipped: in the GRPO recipe with snapshots every 5 s, collections took
    1.3 s of CPU per 100 steps without this and 0.2 s with it. ``gc.unfreeze`` at the end hands them back, so
    runs in one process (tests, benchmarks) leak nothing.
    """
    gc.collect()  # freeze survivors only, not garbage awaiting collection
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_pipeline(
    parts: RolloutParts,
    *,
    gate_factory: GateFactory,
    trainer: Trainer,
    on_step: StepCallback | None = None,
    resume: ResumeSource | None = None,
    fingerprint: str | None = None,
    shutdown: Shutdown | None = None,
) -> RunSummary:
    """Restore (when resuming), then run both pumps until the train pump is done or
    ``shutdown`` is requested.

    With rollout checkpointing enabled, snapshots are written every interval
    (``interval_s``; by default 60 s with the seal journal, 5 s without)
    meanwhile and once more at the end, and trainer checkpoints every
    ``save_period`` steps.
    """
    config = parts.config
    shutdown = shutdown if shutdown is not None else Shutdown()
    gate = gate_factory(parts.data_plane)
    inflight = asyncio.Semaphore(config.rollout.max_inflight_prompts)
    capacity = ReplayCapacity(config.rollout.max_buffered_rollouts)
    dispatch_open = asyncio.Event()
    dispatch_open.set()
    end_weight_version: dict[str, int] = {}
    finalizer = Finalizer(parts, end_weight_version=end_weight_version)
    rollout = RolloutPump(
        parts,
        gate,
        finalizer,
        inflight=inflight,
        capacity=capacity,
        dispatch_open=dispatch_open,
        end_weight_version=end_weight_version,
    )
    checkpointer = (
        Checkpointer(parts, trainer, fingerprint=fingerprint)
        if config.rollout_checkpointing.enabled
        else None
    )
    train = TrainPump(
        parts,
        trainer,
        gate,
        capacity=capacity,
        dispatch_open=dispatch_open,
        on_step=on_step,
        checkpointer=checkpointer,
        shutdown=shutdown,
    )
    # No deadline until a stop is requested; then the grace period's end.
    grace = asyncio.timeout(None)
    final_snapshot: Path | None = None
    stopped: ShutdownLogRecord | None = None
    pending: dict[str, int] = {}
    try:
        try:
            async with grace:
                restorer = None
                if resume is not None:
                    restorer = RolloutRestorer(
                        parts, trainer=trainer, buffer_capacity=capacity, resume=resume
                    )
                    await restorer.restore()
                    if checkpointer is not None:
                        checkpointer.seed_segments(
                            restorer.segment_seed,
                            ledger=restorer.ledger_seed,
                            facts=restorer.fact_seed,
                        )
                    await gate.update_weights(parts.trainer_version)
                pumps = _Pumps(parts, rollout, train, checkpointer, shutdown, grace)
                try:
                    final_snapshot = await pumps.run(restorer)
                except* RunStoppedByIOError as io_stop:
                    # Out of the TaskGroup as itself, so the command can name its cause.
                    raise first_stop(io_stop) from None
                except* TrainerLostError as lost:
                    # The same: a trainer actor that died ends the run with its own message.
                    raise _first_leaf(lost) from None
        except TimeoutError:
            if not grace.expired():
                raise
        finally:
            await gate.close()
        if shutdown.requested:
            stopped = record_shutdown(
                parts, checkpointer, shutdown, final_snapshot, grace_exceeded=grace.expired()
            )
        else:
            # After the final snapshot, so that a restore of it rolls these lines back.
            pending = record_pending(parts)
    finally:
        parts.logs.close()
        if parts.journal is not None:
            parts.journal.close()
        if parts.seal_journal is not None:
            await parts.seal_journal.aclose()
    return RunSummary(
        incarnation=parts.logs.incarnation,
        trainer_version=parts.trainer_version,
        trained_groups=train.trained_groups,
        dropped_groups=rollout.dropped_groups,
        shortfall=parts.shortfall.as_dict(),
        infra_failures=rollout.failures[FailureKind.INFRA],
        data_failures=rollout.failures[FailureKind.DATA],
        groups_in_flight=len(parts.ledger),
        staging_rows_left=len(parts.data_plane.keys(STAGING_PARTITION)),
        snapshots_written=checkpointer.stats.snapshots if checkpointer else 0,
        trainer_checkpoints=checkpointer.stats.trainer_checkpoints if checkpointer else 0,
        shutdown=stopped,
        pending=pending,
    )


def _first_leaf(group: BaseExceptionGroup[TrainerLostError]) -> BaseException:
    """The first exception of a (possibly nested) exception group."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


class _Pumps:
    """Both pumps and the periodic checkpointer, until the end of the run or a stop request."""

    def __init__(
        self,
        parts: RolloutParts,
        rollout: RolloutPump,
        train: TrainPump,
        checkpointer: Checkpointer | None,
        shutdown: Shutdown,
        grace: asyncio.Timeout,
    ) -> None:
        self._parts = parts
        self._rollout = rollout
        self._train = train
        self._checkpointer = checkpointer
        self._shutdown = shutdown
        self._grace = grace

    async def run(self, restorer: RolloutRestorer | None) -> Path | None:
        """Run to the end or the stop, then write the final snapshot; return its path.

        None: checkpointing is off, or nothing changed since the last snapshot.
        A step the train pump is training when the pumps stop finishes beside
        the final snapshot (the TaskGroup awaits it).
        """
        async with asyncio.TaskGroup() as group:
            # A request during the restore: start nothing, keep what it restored.
            if not self._shutdown.requested:
                await self._until_done_or_stopped(group, restorer)
            self._bound_by_grace()
            if self._checkpointer is None:
                return None
            return await self._checkpointer.snapshot_if_changed()

    async def _until_done_or_stopped(
        self, group: asyncio.TaskGroup, restorer: RolloutRestorer | None
    ) -> None:
        rollout_task = group.create_task(self._rollout.run(restorer))
        stoppable: list[asyncio.Task[None]] = [rollout_task]
        if self._checkpointer is not None:
            stoppable.append(group.create_task(self._checkpointer.run_periodic()))
        train_task = group.create_task(self._train.run())
        requested = group.create_task(self._shutdown.wait())
        await asyncio.wait((train_task, requested), return_when=asyncio.FIRST_COMPLETED)
        self._bound_by_grace()
        requested.cancel()
        # In-flight attempts stay in the ledger as dispatched: the snapshot keeps them.
        rollout_task.cancel()
        if self._checkpointer is not None:
            self._checkpointer.stop()  # after the snapshot it may be writing
        await self._parts.notify()  # a train pump waiting for a batch sees the request
        # Then nothing dispatches, seals or snapshots any more.
        await asyncio.wait(stoppable)

    def _bound_by_grace(self) -> None:
        """Once a stop is requested, end everything left by the grace period's end."""
        if self._shutdown.requested:
            grace_s = self._parts.config.rollout_checkpointing.shutdown_grace_s
            self._grace.reschedule(self._shutdown.deadline(grace_s))
