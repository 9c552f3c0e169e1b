"""What a kill left on disk: the seals that were durable, and the attempts in flight.

Read by the supervisor after each SIGKILL, before the next start touches the
checkpoint directory (a restore rotates the seal journal and prunes the
dispatch journal, so afterwards the kill's state is gone). Read the same way
whatever the run's restore mode, so both modes of a comparison are measured
alike: against the newest committed rollout snapshot, as a ``latest`` restore
would see it.

- **Durable seals**: a seal is kept once its journal record is on disk, or once
  a committed snapshot holds it. The journal's records are read as the kill left
  them (:func:`~rollvault.durable.journal_format.read_journal`, which only reads);
  the snapshot holds every attempt log line up to its ``log_sequence``.
- **In flight**: the attempts dispatched and never returned, computed as a
  restore computes its crash evidence
  (:func:`~rollvault.controller.snapshots.crash_evidence.crash_evidence`): the
  snapshot's dispatched attempts plus the dispatch journal's rounds after it,
  less every attempt the journal saw come back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from rollvault.config.schema import RestoreMode, RunConfig
from rollvault.controller.loop.dispatch_journal import (
    DISPATCH_JOURNAL_DIRNAME,
    read_dispatch_journal,
)
from rollvault.controller.loop.seal_journal import SEAL_JOURNAL_DIRNAME, SealRecord, decode_replay
from rollvault.controller.snapshots.crash_evidence import crash_evidence
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.snapshot_files import LoadedSnapshot
from rollvault.durable.bootstrap import holds_run
from rollvault.durable.errors import SnapshotError
from rollvault.durable.journal_format import read_journal
from rollvault.ledger.ledger import RolloutRecoveryLedger
from rollvault.ledger.records import PromptGroupRecoveryRecord


@dataclass(frozen=True)
class InFlightAttempt:
    """An attempt dispatched and not returned at a kill."""

    group_id: str
    generation_index: int
    attempt_hex: str
    prompt: tuple[int, int] | None
    """(epoch, dataset index) of a group the snapshot does not hold (None: it holds it)."""


@dataclass(frozen=True)
class KillEvidence:
    """The state one kill left on disk."""

    start: int
    """The harness's start number that was killed."""
    incarnation: int
    """The run's incarnation counter when it was killed (the killed start's)."""
    snapshot_log_seq: int
    """The newest committed snapshot's ``log_sequence`` (0: none): attempt log
    lines up to it are held by the snapshot."""
    journaled_seals: frozenset[str]
    """Gate rollout ids of every seal record in the seal journal on disk."""
    journal_next_seq: int
    """The seal journal's next record number on disk: its durable position."""
    in_flight: tuple[InFlightAttempt, ...]
    group_prompts: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """(epoch, dataset index) of every group the snapshot, the seal journal or the
    dispatch journal names: the prompt of a group lost with the process, too."""
    group_target_steps: Mapping[str, int | None] = field(default_factory=dict)
    """The target step of every group the snapshot's ledger or the seal journal's
    seals name (None: not stamped): a journaled seal is adopted only at its step."""
    problem: str | None = None
    """Why part of the evidence could not be read (None: all of it was)."""


def read_kill_evidence(config: RunConfig, *, start: int, incarnation: int) -> KillEvidence:
    """Read what the kill of ``start`` left in ``config``'s checkpoint directory."""
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    replay = read_journal(checkpoint_dir / SEAL_JOURNAL_DIRNAME)
    seals = [r.entry for r in decode_replay(replay) if isinstance(r.entry, SealRecord)]
    journaled = frozenset(seal.gate_rollout_id for seal in seals)
    prompts = {seal.group_id: (seal.epoch, seal.dataset_idx) for seal in seals}
    target_steps = {seal.group_id: seal.target_step for seal in seals}
    records: list[PromptGroupRecoveryRecord] = []
    log_seq, dispatch_seq, problem = 0, 0, None
    try:
        snapshot = _newest_snapshot(config)
    except SnapshotError as error:
        snapshot, problem = None, f"start {start}: no snapshot to read at the kill: {error}"
    if snapshot is not None:
        log_seq = snapshot.controller.log_sequence
        dispatch_seq = snapshot.controller.dispatch_journal_seq
        records = RolloutRecoveryLedger.from_state_dict(snapshot.recovery.ledger_state).groups()
        target_steps |= {record.group_id: record.target_step for record in records}
        origins = snapshot.controller.origins.items()
        prompts |= {group: (origin.epoch, origin.dataset_idx) for group, origin in origins}
    tail = read_dispatch_journal(checkpoint_dir / DISPATCH_JOURNAL_DIRNAME, after_seq=dispatch_seq)
    prompts |= {line.group_id: (line.epoch, line.dataset_idx) for line in tail.dispatched}
    evidence = crash_evidence(records, tail, reason="measured by the chaos harness")
    in_flight = [
        InFlightAttempt(group_id, attempt.generation_index, attempt.attempt_uuid.hex, None)
        for group_id, attempts in evidence.in_ledger.items()
        for attempt in attempts
    ]
    in_flight += [
        InFlightAttempt(
            lost.group_id, lost.generation_index, lost.attempt_uuid, (lost.epoch, lost.dataset_idx)
        )
        for lost in evidence.lost
    ]
    return KillEvidence(
        start=start,
        incarnation=incarnation,
        snapshot_log_seq=log_seq,
        journaled_seals=journaled,
        journal_next_seq=replay.next_seq,
        in_flight=tuple(in_flight),
        group_prompts=prompts,
        group_target_steps=target_steps,
        problem=problem,
    )


KILL_EVIDENCE_FILENAME: Final = "kill_evidence.json"
"""In the harness's run dir: every kill's evidence, so a run's loss can be re-read."""


def write_kill_evidence(path: Path, evidence: list[KillEvidence]) -> None:
    """Write the kills' evidence as JSON (the run dir is the harness's own)."""
    path.write_bytes(msgspec.json.encode(evidence))


def load_kill_evidence(path: Path) -> list[KillEvidence]:
    """The kills' evidence :func:`write_kill_evidence` wrote; raises naming the file if bad."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[KillEvidence])
    except msgspec.ValidationError as error:
        raise ValueError(f"{path}: not the chaos harness's kill evidence: {error}") from error


def _newest_snapshot(config: RunConfig) -> LoadedSnapshot | None:
    """The snapshot a ``latest`` restore would use now (None: none yet)."""
    if not holds_run(Path(config.checkpointing.checkpoint_dir)):
        return None  # killed before its anchor: reading must not create one
    latest = msgspec.structs.replace(
        config,
        rollout_checkpointing=msgspec.structs.replace(
            config.rollout_checkpointing, restore_mode=RestoreMode.LATEST
        ),
    )
    source = prepare_checkpoint_dir(latest)
    return None if source is None else source.snapshot
