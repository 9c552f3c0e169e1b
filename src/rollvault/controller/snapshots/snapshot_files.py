"""The files of one rollout snapshot: what they hold, how they are written and checked.

::

    snapshot_<seq>/
      manifest.json                  RolloutSnapshotManifest (durable layer)
      rollout_recovery.json          the ledger sidecar (rollvault.ledger.sidecar): since
                                     version 6 an index of the ledger segments
                                     (../segments/*.ledger-segment.msgpack, form 4,
                                     3 still read;
                                     *.ledger-segment.json of forms 1-2 still read)
                                     holding each live group's current record, plus the
                                     controller state;
                                     since version 7 without the finalizer maps (in the
                                     group facts); since version 8 the index's groups
                                     as runs of consecutive records; since version 9
                                     its segments as compact rows
      replay_buffer_metadata.json    canonical groups waiting to train (before version 2
                                     also each one's attempts, now in the group facts);
                                     since version 3 only their order, each entry a
                                     replay fact of the group facts
      replacement_reserve.json       spare prompts
      controller_state.json          sampler and dataloader cursors, log seq, dispatch
                                     journal seq, lost groups' interrupted attempts (before
                                     version 5 also the group origins and prompt identities,
                                     now in the group facts)
      group_facts.json               the index of the group facts (since controller state
                                     version 5): the fact segments
                                     (../segments/*.facts-segment.msgpack, form 2;
                                     *.facts-segment.json of form 1 still read) holding each
                                     group's origin and prompt identity, each canonical
                                     group's finalization (attempt ids, rewards, metrics)
                                     and (index version 2) each waiting group's replay
                                     entry, written once per anchor, and which are live
                                     (since index version 3 each segment a compact row)
      env_rollouts.json              the environment state of every in-flight episode at
                                     its last committed turn (absent before multi-turn
                                     episodes: then no episode is in flight)
      data_plane/metadata.json       the index of every live row: the segments holding
                                     them (../segments/, shared by the anchor's snapshots;
                                     a snapshot elsewhere, like a trainer checkpoint's,
                                     keeps its own segments/) and which of their rows;
                                     it advertises, for each sidecar above, its SHA-256,
                                     schema version and group count

A snapshot writes only the rows new since the previous snapshot of its anchor
(:class:`~rollvault.dataplane.segmented_writer.SegmentedWriter`) and the records of
the groups that changed since then
(:class:`~rollvault.controller.snapshots.ledger_segments.LedgerSegmentWriter`),
and the per-group facts new since then
(:class:`~rollvault.controller.snapshots.fact_writer.FactSegmentWriter`).
Snapshots written before segments keep their rows in ``data_plane/`` itself
(data-plane format version 1) and still load; so do ledger sidecars of
version 5 and before, which hold every group themselves, and the files before
group facts (controller state 4, replay metadata 1, sidecar 6 and before),
which hold the per-group maps themselves. Whatever the version, a
:class:`LoadedSnapshot` holds the maps resolved (``controller.origins``,
``replay.canonical_attempts``, the sidecar's finalizer maps).

Everything is JSON decoded into strict msgspec Structs, or safetensors: never
pickle. Reading checks every file on its own: each sidecar must match what the
data plane's metadata advertises. A failed check raises
:class:`SnapshotCorruptError` naming the file, so that restore falls back to
an older snapshot; the references between files are checked by
:mod:`rollvault.controller.snapshots.verification`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from rollvault.controller.data.dataloader import DataLoaderState
from rollvault.controller.data.replay_index import ReplayIndexState
from rollvault.controller.data.sampler import SamplerState
from rollvault.controller.data.shortfall import SparePromptsState
from rollvault.controller.loop.dispatch_journal import LostGroupInterruption
from rollvault.controller.loop.episodes import EpisodeState
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.controller.loop.seal_journal import SealRecord
from rollvault.controller.snapshots.fact_index import (
    GROUP_FACTS_FILENAME,
    GROUP_FACTS_SCHEMA_VERSION,
    FactsError,
    encode_group_facts_file,
)
from rollvault.controller.snapshots.fact_segments import (
    LoadedFacts,
    read_group_facts,
    replay_in_order,
)
from rollvault.controller.snapshots.fact_writer import FactSegmentWriter
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter, catalog_listing
from rollvault.controller.snapshots.write_budget import headroom
from rollvault.dataplane.capture import DataPlaneCapture
from rollvault.dataplane.checkpoint_io import LoadedCheckpoint
from rollvault.dataplane.errors import DataPlaneCheckpointError
from rollvault.dataplane.segmented import LoadedSegmented, open_any_checkpoint
from rollvault.dataplane.segmented_writer import SegmentedWriter
from rollvault.durable.errors import SnapshotError
from rollvault.durable.layout import ROLLOUT_SNAPSHOTS_DIRNAME, SEGMENTS_DIRNAME
from rollvault.durable.manifest_schema import RolloutSnapshotManifest
from rollvault.durable.segment_store import RecordedSegmentError, read_recorded_segment
from rollvault.ledger.errors import LedgerError
from rollvault.ledger.indexed_sidecar import (
    CATALOG_SIDECAR_SCHEMA_VERSION,
    COMPACT_SIDECAR_SCHEMA_VERSION,
    FACTS_APART_SIDECAR_SCHEMA_VERSION,
    INDEXED_SIDECAR_SCHEMA_VERSION,
    RUNS_SIDECAR_SCHEMA_VERSION,
    LedgerCatalogRef,
    LedgerIndex,
    LedgerSegmentRef,
    assemble_indexed_ledger,
    decode_catalog_sidecar,
    decode_compact_sidecar,
    decode_facts_apart_sidecar,
    decode_indexed_sidecar,
    decode_runs_sidecar,
    encode_catalog_sidecar,
)
from rollvault.ledger.ledger_records import RecordChain, SegmentRecords, decode_ledger_segment
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.sidecar import (
    ROLLOUT_RECOVERY_STATE_FILENAME,
    ParsedRolloutRecoveryState,
    decode_rollout_recovery_state,
    encode_rollout_recovery_state,
)
from rollvault.ledger.state_schema import (
    SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS,
    RolloutRecoveryState,
)

SNAPSHOT_FILES_SCHEMA_VERSION: Final = 1
CONTROLLER_STATE_SCHEMA_VERSION: Final = 5
"""Version 2 of ``controller_state.json`` adds ``dispatch_journal_seq`` and
``lost_interruptions``, version 3 ``seal_journal_seq``, version 4
``pooled_seals``; version 5 drops ``origins`` and ``prompt_identities``,
which ``group_facts.json`` indexes since. Version 1 (every other file's
version) is still read: it was written before the dispatch journal, so it
reflects none of it and no interruption is pending; version 2 was written
before the seal journal (it reflects none of it, seq 0); version 3 before
seals were pooled across snapshots (none pooled); version 4 holds the
origins itself."""
SUPPORTED_CONTROLLER_STATE_SCHEMA_VERSIONS: Final = frozenset({1, 2, 3, 4, 5})
REPLAY_BUFFER_SCHEMA_VERSION: Final = 3
"""Version 2 of ``replay_buffer_metadata.json`` drops ``canonical_attempts``,
which ``group_facts.json`` indexes since; version 1 holds them itself. Version
3 drops the entries too (~160 bytes per waiting group, rewritten at every
snapshot): each is a replay fact of the group facts (index version 2), written
once, and the file holds their order (:class:`_ReplayBufferFileV3`)."""
SUPPORTED_REPLAY_BUFFER_SCHEMA_VERSIONS: Final = frozenset({1, 2, 3})
_FIRST_REPLAY_WITH_FACTS: Final = 2
_FACTS_APART_SIDECAR_VERSIONS: Final = frozenset(
    {
        FACTS_APART_SIDECAR_SCHEMA_VERSION,
        RUNS_SIDECAR_SCHEMA_VERSION,
        COMPACT_SIDECAR_SCHEMA_VERSION,
        CATALOG_SIDECAR_SCHEMA_VERSION,
    }
)
"""Ledger sidecar versions whose finalizer maps are in the group facts (8: the index's
groups as runs, :data:`~rollvault.ledger.indexed_sidecar.RUNS_SIDECAR_SCHEMA_VERSION`;
9: its segments as compact rows too,
:data:`~rollvault.ledger.indexed_sidecar.COMPACT_SIDECAR_SCHEMA_VERSION`; 10, written:
those rows in ledger catalogs beside the segments,
:data:`~rollvault.ledger.indexed_sidecar.CATALOG_SIDECAR_SCHEMA_VERSION`)."""
_SIDECAR_DECODERS: Final = {
    FACTS_APART_SIDECAR_SCHEMA_VERSION: decode_facts_apart_sidecar,
    RUNS_SIDECAR_SCHEMA_VERSION: decode_runs_sidecar,
    COMPACT_SIDECAR_SCHEMA_VERSION: decode_compact_sidecar,
}
"""The decoder of each version of :data:`_FACTS_APART_SIDECAR_VERSIONS` but version 10
(which reads its catalogs too: :func:`_decode_indexed`)."""
REPLAY_BUFFER_METADATA_FILENAME: Final = "replay_buffer_metadata.json"
REPLACEMENT_RESERVE_FILENAME: Final = "replacement_reserve.json"
CONTROLLER_STATE_FILENAME: Final = "controller_state.json"
ENV_ROLLOUTS_FILENAME: Final = "env_rollouts.json"
ENV_ROLLOUTS_SCHEMA_VERSION: Final = 1
DATA_PLANE_DIRNAME: Final = "data_plane"
SIDECARS_METADATA_KEY: Final = "sidecars"
_TMP_SNAPSHOT_RE: Final = re.compile(r"tmp_snapshot_([0-9]+)")


def segments_dir_for(snapshot_dir: Path) -> Path:
    """Where the segments of the snapshot at ``snapshot_dir`` are.

    Beside it for a snapshot in an anchor's ``rollout_snapshots/`` (committed
    or still ``tmp_``): they are shared by the anchor's snapshots. Inside it
    for any other snapshot (a trainer checkpoint's ``rollout_state/``), which
    then stands on its own.
    """
    parent = snapshot_dir.parent
    if parent.name == ROLLOUT_SNAPSHOTS_DIRNAME:
        return parent / SEGMENTS_DIRNAME
    return snapshot_dir / SEGMENTS_DIRNAME


def _segment_stem(directory: Path) -> str:
    # The snapshot's sequence number: above every snapshot on disk, so no committed
    # snapshot references a segment of that name (see publish_segment).
    match = _TMP_SNAPSHOT_RE.fullmatch(directory.name)
    return match.group(1) if match else "000000"


class SnapshotCorruptError(SnapshotError):
    """A snapshot file is missing, damaged, or disagrees with another one."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class ReplayBufferFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Canonical groups waiting to train, as of the snapshot's base train step.

    The file's content resolved: version 1 is this exactly; version 2
    (:class:`_ReplayBufferFileV2`) holds ``canonical_attempts`` in the group facts.
    """

    schema_version: int
    replay: ReplayIndexState
    canonical_attempts: dict[str, list[str]]
    """Per canonical group, the gate rollout id of each sibling's published attempt."""


class ControllerStateFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Cursors and bookkeeping that no other sidecar owns.

    The file's content resolved: version 4 is this exactly; version 5
    (:class:`_ControllerStateFileV5`) holds ``origins`` and
    ``prompt_identities`` in the group facts.
    """

    schema_version: int
    sampler: SamplerState
    dataloader: DataLoaderState
    origins: dict[str, GroupOrigin]
    """Every group in the ledger or the replay index: its epoch and dataset index."""
    prompt_identities: dict[str, str]
    """Per group, the dataset's identity digest of its prompt, checked on rehydration."""
    log_sequence: int
    dispatch_journal_seq: Annotated[int, msgspec.Meta(ge=0)]
    """The dispatch journal's position this snapshot reflects (version 2)."""
    lost_interruptions: list[LostGroupInterruption]
    """Interrupted attempts of lost groups, for their prompts' next groups (version 2)."""
    seal_journal_seq: Annotated[int, msgspec.Meta(ge=0)]
    """The seal journal's next seq when the snapshot was cut: it reflects every
    record below it, and a restore replays the records from it on (version 3)."""
    pooled_seals: list[SealRecord]
    """Journaled seals of groups an earlier start lost, still waiting for their
    prompts to be reserved again (version 4). The journal segments that held
    them are dropped once this snapshot commits, so the snapshot keeps them."""


class EnvRolloutsFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The environment's rollouts: in-flight episodes at their last committed turn."""

    schema_version: int
    episodes: dict[str, EpisodeState]
    """By logical rollout id; each entry's revision equals its ledger attempt's."""
    next_nemo_gym_task_index: Annotated[int, msgspec.Meta(ge=0)] | None
    """The task cursor of environments that assign task indices (None: none do)."""


def empty_env_rollouts() -> EnvRolloutsFile:
    """The env rollouts of a snapshot written before them: no episode in flight."""
    return EnvRolloutsFile(
        schema_version=ENV_ROLLOUTS_SCHEMA_VERSION, episodes={}, next_nemo_gym_task_index=None
    )


class _ControllerStateFileV1(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    schema_version: int
    sampler: SamplerState
    dataloader: DataLoaderState
    origins: dict[str, GroupOrigin]
    prompt_identities: dict[str, str]
    log_sequence: int


# Each version adds fields to the one before (a subclass's fields follow its base's).
class _ControllerStateFileV2(_ControllerStateFileV1, frozen=True, kw_only=True):
    dispatch_journal_seq: Annotated[int, msgspec.Meta(ge=0)]
    lost_interruptions: list[LostGroupInterruption]


class _ControllerStateFileV3(_ControllerStateFileV2, frozen=True, kw_only=True):
    seal_journal_seq: Annotated[int, msgspec.Meta(ge=0)]


class _ControllerStateFileV5(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``controller_state.json`` version 5 as it is on disk: the per-group maps apart."""

    schema_version: int
    sampler: SamplerState
    dataloader: DataLoaderState
    log_sequence: int
    dispatch_journal_seq: Annotated[int, msgspec.Meta(ge=0)]
    lost_interruptions: list[LostGroupInterruption]
    seal_journal_seq: Annotated[int, msgspec.Meta(ge=0)]
    pooled_seals: list[SealRecord]


class _ReplayBufferFileV2(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``replay_buffer_metadata.json`` version 2 as it is on disk: the attempt ids apart."""

    schema_version: int
    replay: ReplayIndexState


class _ReplayBufferFileV3(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``replay_buffer_metadata.json`` version 3 as it is on disk: the entries in the group
    facts, their order here."""

    schema_version: int
    index_schema_version: int
    """The replay index's own ``schema_version`` (``ReplayIndexState``)."""
    order: list[tuple[Annotated[int, msgspec.Meta(ge=0)], Annotated[int, msgspec.Meta(ge=1)]]]
    """The entries in the index's order, as runs ``(first, count)`` of positions among the
    live replay facts (:func:`~.fact_writer.replay_order_runs`)."""


class _Versioned(msgspec.Struct):
    schema_version: int


class SidecarDigest(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What the data plane's metadata advertises about one sidecar file."""

    sha256: str
    schema_version: int
    group_count: int


@dataclass(frozen=True)
class RolloutStateCapture:
    """Everything a snapshot writes, captured inside the exclusive cut.

    In-memory and immutable: captured objects are copies or frozen, and the
    data-plane capture holds references to read-only rows. Nothing here has
    been encoded yet; that happens after the cut is released.
    """

    manifest: RolloutSnapshotManifest
    recovery_state: RolloutRecoveryState
    replay: ReplayBufferFile
    spares: SparePromptsState
    controller: ControllerStateFile
    data_plane: DataPlaneCapture
    generations_per_group: int
    finalized: Mapping[str, FinalizedGroup]
    """Per canonical group what the finalizer recorded (frozen, never changed): written
    into the group facts, with ``controller``'s origins and prompt identities."""
    env_rollouts: EnvRolloutsFile = dataclasses.field(default_factory=empty_env_rollouts)
    ledger_records: tuple[PromptGroupRecoveryRecord, ...] | None = None
    """The live groups' records (shared copy-on-write, never changed), in ledger order:
    then ``recovery_state`` is the envelope without the ledger
    (:func:`~rollvault.ledger.sidecar.build_sidecar_envelope`) and the sidecar is written
    indexed (version 6). None: ``recovery_state`` is a whole version 5 sidecar, written
    as it is (the writer before ledger segments; tests of older snapshots use it)."""


@dataclass(frozen=True)
class LoadedSnapshot:
    """A verified snapshot, decoded."""

    path: Path
    manifest: RolloutSnapshotManifest
    recovery: ParsedRolloutRecoveryState
    replay: ReplayBufferFile
    spares: SparePromptsState
    controller: ControllerStateFile
    data_plane: LoadedCheckpoint
    env_rollouts: EnvRolloutsFile = dataclasses.field(default_factory=empty_env_rollouts)
    segments: LoadedSegmented | None = None
    """Where each row is in its segments (None: read from rows): seeds the next writer."""
    ledger_index: LedgerIndex | None = None
    """Where each group's record is in the ledger segments (None: a version 5 sidecar)."""
    ledger_chains: tuple[RecordChain, ...] = ()
    """Per group of ``ledger_index``, the records it was resolved from (seeds the next writer)."""
    facts: LoadedFacts | None = None
    """The group facts and where each is (None: the files before them held the maps)."""


@dataclass(frozen=True)
class SegmentSeed:
    """A restored snapshot's rows, for the next snapshot to reference instead of rewriting.

    ``capture`` was taken right after the rows were loaded, so its tokens
    stand for the loaded rows (see :meth:`SegmentedWriter.seed`).
    """

    segments_dir: Path
    capture: DataPlaneCapture
    loaded: LoadedSegmented

    def writer(self) -> SegmentedWriter:
        """A writer whose next snapshot writes only rows new since the restored one."""
        writer = SegmentedWriter(self.segments_dir)
        writer.seed(self.capture, self.loaded)
        return writer


_ENCODER: Final = msgspec.json.Encoder(order="sorted")


def write_snapshot_payload(
    capture: RolloutStateCapture,
    directory: Path,
    *,
    segments: SegmentedWriter | None = None,
    ledger: LedgerSegmentWriter | None = None,
    facts: FactSegmentWriter | None = None,
) -> int:
    """Write every file but the manifest into ``directory``; return the bytes written.

    Sync; the new segments are durable when it returns, the other files
    unflushed: the caller runs it in a worker thread and the durable layer's
    commit fsyncs and publishes the directory. ``segments`` writes the rows
    new since its last committed snapshot into :func:`segments_dir_for`
    ``directory`` (call its ``committed`` once this snapshot is); without one,
    every row is written, into a fresh writer's segments. ``ledger`` does the
    same for the ledger's records (see :attr:`RolloutStateCapture.ledger_records`),
    and ``facts`` for the per-group facts (``group_facts.json`` is their index).

    The rows are planned first, so their bytes are known before anything is written: the
    fact segments merge by choice only within the room they leave (:func:`headroom`).
    """
    writer = segments if segments is not None else SegmentedWriter(segments_dir_for(directory))
    if writer.segments_dir != segments_dir_for(directory):
        raise ValueError(
            f"{directory}: its segments belong in {segments_dir_for(directory)}, "
            f"the writer writes {writer.segments_dir}"
        )
    rows = writer.plan(capture.data_plane)
    sidecar, sidecar_version, group_count, ledger_bytes = _recovery_sidecar(
        capture, directory, ledger
    )
    controller, replay = capture.controller, capture.replay
    if (controller.schema_version, replay.schema_version) != (
        CONTROLLER_STATE_SCHEMA_VERSION,
        REPLAY_BUFFER_SCHEMA_VERSION,
    ):
        raise ValueError(
            f"{directory}: only the current controller state and replay metadata versions "
            f"are written, not {controller.schema_version} and {replay.schema_version}"
        )
    fact_writer = facts if facts is not None else FactSegmentWriter(segments_dir_for(directory))
    if fact_writer.segments_dir != segments_dir_for(directory):
        raise ValueError(
            f"{directory}: its fact segments belong in {segments_dir_for(directory)}, "
            f"the writer writes {fact_writer.segments_dir}"
        )
    written_before = ledger_bytes + len(sidecar)
    pending_facts = fact_writer.write(
        controller.origins,
        controller.prompt_identities,
        capture.finalized,
        stem=_segment_stem(directory),
        replay=replay.replay.entries,
        room=headroom(rows.new_row_bytes, written_before, fact_writer.later_bytes),
    )
    files = {
        ROLLOUT_RECOVERY_STATE_FILENAME: sidecar,
        REPLAY_BUFFER_METADATA_FILENAME: _ENCODER.encode(
            _ReplayBufferFileV3(
                schema_version=replay.schema_version,
                index_schema_version=replay.replay.schema_version,
                order=pending_facts.replay_order,
            )
        ),
        REPLACEMENT_RESERVE_FILENAME: _ENCODER.encode(capture.spares),
        CONTROLLER_STATE_FILENAME: _ENCODER.encode(_on_disk_controller_state(controller)),
        ENV_ROLLOUTS_FILENAME: _ENCODER.encode(capture.env_rollouts),
        GROUP_FACTS_FILENAME: encode_group_facts_file(pending_facts.index, pending_facts.catalogs),
    }
    counts = {
        ROLLOUT_RECOVERY_STATE_FILENAME: (sidecar_version, group_count),
        REPLAY_BUFFER_METADATA_FILENAME: (
            capture.replay.schema_version,
            len(capture.replay.replay.entries),
        ),
        REPLACEMENT_RESERVE_FILENAME: (capture.spares.schema_version, len(capture.spares.prompts)),
        CONTROLLER_STATE_FILENAME: (
            capture.controller.schema_version,
            len(capture.controller.origins),
        ),
        ENV_ROLLOUTS_FILENAME: (
            capture.env_rollouts.schema_version,
            len(capture.env_rollouts.episodes),
        ),
        GROUP_FACTS_FILENAME: (GROUP_FACTS_SCHEMA_VERSION, pending_facts.index.live_facts),
    }
    digests: dict[str, Any] = {}
    for name, data in files.items():
        with open(directory / name, "xb") as handle:
            handle.write(data)
        version, count = counts[name]
        digests[name] = msgspec.to_builtins(
            SidecarDigest(sha256=_sha256(data), schema_version=version, group_count=count)
        )
    pending = writer.write(
        directory / DATA_PLANE_DIRNAME,
        capture.data_plane,
        {SIDECARS_METADATA_KEY: digests},
        stem=_segment_stem(directory),
        plan=rows,
    )
    total = (
        pending.info.bytes_written
        + ledger_bytes
        + pending_facts.info.segment_bytes
        + pending_facts.info.catalog_bytes
        + sum(len(data) for data in files.values())
    )
    # What this snapshot wrote after its facts were chosen, beside its rows: the next
    # snapshot's estimate of its own (the indexes change little from one to the next).
    pending_facts.later_bytes = (
        total - rows.new_row_bytes - written_before - pending_facts.info.segment_bytes
    )
    return total


def _on_disk_controller_state(state: ControllerStateFile) -> _ControllerStateFileV5:
    """The controller state as version 5 stores it: the per-group maps go to the group facts."""
    return _ControllerStateFileV5(
        schema_version=state.schema_version,
        sampler=state.sampler,
        dataloader=state.dataloader,
        log_sequence=state.log_sequence,
        dispatch_journal_seq=state.dispatch_journal_seq,
        lost_interruptions=state.lost_interruptions,
        seal_journal_seq=state.seal_journal_seq,
        pooled_seals=state.pooled_seals,
    )


def _recovery_sidecar(
    capture: RolloutStateCapture, directory: Path, ledger: LedgerSegmentWriter | None
) -> tuple[bytes, int, int, int]:
    """The sidecar's bytes, version and group count, and the ledger segment bytes written."""
    records = capture.ledger_records
    if records is None:
        state = capture.recovery_state
        data = encode_rollout_recovery_state(state)
        return data, state["schema_version"], len(state["ledger"]["groups"]), 0
    writer = ledger if ledger is not None else LedgerSegmentWriter(segments_dir_for(directory))
    if writer.segments_dir != segments_dir_for(directory):
        raise ValueError(
            f"{directory}: its ledger segments belong in {segments_dir_for(directory)}, "
            f"the writer writes {writer.segments_dir}"
        )
    pending = writer.write(records, stem=_segment_stem(directory))
    # The finalizer maps are in the group facts, written once per canonical group, the
    # index's groups are runs (version 8) and its segments' rows in catalogs (version 10).
    catalogs = [catalog_listing(pending.catalogs[file]) for file in sorted(pending.catalogs)]
    data = encode_catalog_sidecar(capture.recovery_state, pending.index, catalogs)
    written = pending.info.segment_bytes + pending.info.catalog_bytes
    return data, CATALOG_SIDECAR_SCHEMA_VERSION, len(records), written


def read_snapshot_files(path: Path, manifest: RolloutSnapshotManifest) -> LoadedSnapshot:
    """Read and decode every file of the snapshot at ``path``, checking each on its own.

    Checks the data plane's files, each sidecar's advertised SHA-256, schema
    and group count; the references between files are checked by
    :mod:`rollvault.controller.snapshots.verification`. Raises
    :class:`SnapshotCorruptError` naming the first bad file.
    """
    # The data plane's segments are hashed in a worker thread while this one reads
    # the sidecars and builds the ledger's records; its rows are decoded after.
    with data_plane_refusals():
        opened = open_any_checkpoint(path / DATA_PLANE_DIRNAME, segments_dir_for(path))
    try:
        digests = advertised_digests(path / DATA_PLANE_DIRNAME, opened.user_metadata)
        raw = {
            name: checked_bytes(path / name, digest)
            for name, digest in digests.items()
            if name != ROLLOUT_RECOVERY_STATE_FILENAME
        }
        facts = read_facts(path, raw)
        _check_facts_count(path, facts, digests)
        recovery, indexed = read_recovery_sidecar_indexed(
            path / ROLLOUT_RECOVERY_STATE_FILENAME, digests, facts=facts
        )
    except Exception:
        # Read before the sidecars, a damaged data plane was the problem named: it still is.
        with data_plane_refusals():
            opened.finish()
        raise
    with data_plane_refusals():
        segments = opened.finish()
    data_plane = segments.checkpoint
    snapshot = LoadedSnapshot(
        path=path,
        manifest=manifest,
        recovery=recovery,
        replay=decode_replay_buffer(path, raw, facts),
        spares=_decode(path, REPLACEMENT_RESERVE_FILENAME, raw, SparePromptsState),
        controller=_decode_controller_state(path, raw, facts),
        data_plane=data_plane,
        env_rollouts=decode_env_rollouts(path, raw),
        segments=segments if segments.segments else None,
        ledger_index=None if indexed is None else indexed.index,
        ledger_chains=() if indexed is None else indexed.chains,
        facts=facts,
    )
    _check_counts(snapshot, digests)
    return snapshot


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def data_plane_refusals() -> Iterator[None]:
    """A data plane's refusal raised as the snapshot's: a :class:`SnapshotCorruptError`
    naming the same file and problem."""
    try:
        yield
    except DataPlaneCheckpointError as exc:
        raise SnapshotCorruptError(exc.path, exc.problem) from exc


def advertised_digests(
    directory: Path, user_metadata: Mapping[str, Any]
) -> dict[str, SidecarDigest]:
    """The sidecar digests a data-plane checkpoint's ``user_metadata`` advertises."""
    expected = {
        ROLLOUT_RECOVERY_STATE_FILENAME,
        REPLAY_BUFFER_METADATA_FILENAME,
        REPLACEMENT_RESERVE_FILENAME,
        CONTROLLER_STATE_FILENAME,
    }
    try:
        digests = msgspec.convert(
            user_metadata.get(SIDECARS_METADATA_KEY), dict[str, SidecarDigest], strict=True
        )
    except msgspec.ValidationError as exc:
        raise SnapshotCorruptError(
            directory / "metadata.json", f"user_metadata.{SIDECARS_METADATA_KEY}: {exc}"
        ) from exc
    # env_rollouts.json and group_facts.json came later: a snapshot before them advertises none.
    if set(digests) - {ENV_ROLLOUTS_FILENAME, GROUP_FACTS_FILENAME} != expected:
        raise SnapshotCorruptError(
            directory / "metadata.json",
            f"advertises sidecars {sorted(digests)}, expected {sorted(expected)} "
            f"(and {ENV_ROLLOUTS_FILENAME}, {GROUP_FACTS_FILENAME})",
        )
    return digests


def read_facts(path: Path, raw: Mapping[str, bytes]) -> LoadedFacts | None:
    """The group facts of the snapshot at ``path`` (``raw``: its checked sidecar bytes).

    None when it has no ``group_facts.json`` (written before them). Every
    referenced fact segment is read and checked whole; a bad index or segment
    raises :class:`SnapshotCorruptError` naming it.
    """
    data = raw.get(GROUP_FACTS_FILENAME)
    if data is None:
        return None
    try:
        return read_group_facts(path / GROUP_FACTS_FILENAME, data, segments_dir_for(path))
    except FactsError as exc:
        raise SnapshotCorruptError(exc.path, exc.problem) from exc


def _facts_for_sidecar(
    path: Path, digests: Mapping[str, SidecarDigest], facts: LoadedFacts | None, version: int
) -> LoadedFacts:
    """The group facts a version 7, 8 or 9 sidecar at ``path`` needs: ``facts``, or read beside
    it."""
    if facts is None:
        digest = digests.get(GROUP_FACTS_FILENAME)
        if digest is not None:
            data = checked_bytes(path.parent / GROUP_FACTS_FILENAME, digest)
            facts = read_facts(path.parent, {GROUP_FACTS_FILENAME: data})
    if facts is None:
        raise SnapshotCorruptError(
            path,
            f"schema {version} keeps its finalizer maps in "
            f"{GROUP_FACTS_FILENAME}, which data_plane/metadata.json does not advertise",
        )
    return facts


def checked_bytes(path: Path, digest: SidecarDigest) -> bytes:
    """The bytes of ``path``, refused unless their SHA-256 is the advertised one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotCorruptError(path, f"cannot read: {exc.strerror or exc}") from exc
    actual = _sha256(data)
    if actual != digest.sha256:
        raise SnapshotCorruptError(
            path, f"SHA-256 {actual} does not match {digest.sha256} in data_plane/metadata.json"
        )
    return data


@dataclass(frozen=True)
class IndexedLedger:
    """A version 6 sidecar's index and, per group in it, the chain of records it resolved."""

    index: LedgerIndex
    chains: tuple[RecordChain, ...]


_LAST_DECODED: dict[
    tuple[str, int, int, str], tuple[ParsedRolloutRecoveryState, IndexedLedger | None]
] = {}
"""The last ledger sidecar this process decoded, by SHA-256 and advertised schema and count.

A restore reads the sidecar that verification decoded moments before (to
refuse a file changed since, it reads and hashes the bytes again). The same
bytes decode to the same state, and decoding and checking 16k attempts is
most of a restore's CPU time, so the second decode is taken from here. One
entry, put there by verification only and dropped when the restore uses it: nothing
stays alive for the rest of the run. Verification never takes it: it decodes what is
on disk each time (the sidecar's catalogs and segments are read again, so a file
changed under an unchanged sidecar is refused) and replaces the entry, so the same
bytes verified twice still leave one parse for the restore. The restore's own decode
(when the bytes are not those verified) is not put there: else each restore after it
missed and decoded again, and the entry it left outlived the run's start.
"""


def read_recovery_sidecar_file(
    path: Path, digests: Mapping[str, SidecarDigest]
) -> ParsedRolloutRecoveryState:
    """Read the ledger sidecar at ``path`` and check it against what the data plane advertises.

    The one implementation of the sidecar's own checks, shared by restore's
    ``read_recovery_sidecar`` and by verification: the advertised SHA-256,
    ledger schema (:func:`decode_recovery_sidecar`) and group count. Sync:
    call it in a worker thread from async code. Raises
    :class:`SnapshotCorruptError` naming the file. A version 6 sidecar's
    ledger segments are read and checked too (a missing or damaged one is named).
    A parse verification left is used (and dropped); a decode here is not kept.
    """
    data, digest, key = _sidecar_bytes(path, digests)
    decoded = _LAST_DECODED.pop(key, None)
    if decoded is None:
        decoded = _decode_sidecar(path, digests, data, digest)
    return _with_advertised_count(path, digest, decoded)[0]


def read_recovery_sidecar_indexed(
    path: Path, digests: Mapping[str, SidecarDigest], *, facts: LoadedFacts | None = None
) -> tuple[ParsedRolloutRecoveryState, IndexedLedger | None]:
    """:func:`read_recovery_sidecar_file`, and the ledger index and chains of a version 6,
    7, 8 or 9 sidecar. ``facts``: the snapshot's group facts if already read (versions 7 to
    8 take their finalizer maps from them; else they are read beside it).

    Verification's read: always a decode of what is on disk, whose parse replaces the
    one in ``_LAST_DECODED`` for the restore that follows."""
    data, digest, key = _sidecar_bytes(path, digests)
    decoded = _decode_sidecar(path, digests, data, digest, facts)
    _LAST_DECODED.clear()
    _LAST_DECODED[key] = decoded
    return _with_advertised_count(path, digest, decoded)


def _decode_sidecar(
    path: Path,
    digests: Mapping[str, SidecarDigest],
    data: bytes,
    digest: SidecarDigest,
    facts: LoadedFacts | None = None,
) -> tuple[ParsedRolloutRecoveryState, IndexedLedger | None]:
    """The sidecar ``data`` (checked against ``digest``) decoded by its advertised schema."""
    if digest.schema_version == INDEXED_SIDECAR_SCHEMA_VERSION:
        return _decode_indexed(path, data)
    if digest.schema_version in _FACTS_APART_SIDECAR_VERSIONS:
        return _decode_indexed(
            path,
            data,
            _facts_for_sidecar(path, digests, facts, digest.schema_version),
            version=digest.schema_version,
        )
    return decode_recovery_sidecar(path, data, digest), None


def reread_decoded_recovery_sidecar(
    path: Path, digests: Mapping[str, SidecarDigest]
) -> ParsedRolloutRecoveryState | None:
    """:func:`read_recovery_sidecar_file` when this process has just decoded the same bytes
    (verification, before a restore), else None and nothing is decoded.

    The bytes are read and hashed again (a file changed since is refused), and the count
    is checked again, exactly as :func:`read_recovery_sidecar_file` does. What it leaves
    out is the decode, so async code calls it on the event loop: handing a ~0.1 ms read to
    a worker thread cost more than the read (and the decode, when it must run, goes there).
    """
    _data, digest, key = _sidecar_bytes(path, digests)
    cached = _LAST_DECODED.pop(key, None)
    return None if cached is None else _with_advertised_count(path, digest, cached)[0]


def _sidecar_bytes(
    path: Path, digests: Mapping[str, SidecarDigest]
) -> tuple[bytes, SidecarDigest, tuple[str, int, int, str]]:
    """The sidecar's bytes checked against their advertised digest, and their cache key."""
    digest = digests.get(path.name)
    if digest is None:
        raise SnapshotCorruptError(path, "the data-plane metadata does not advertise it")
    data = checked_bytes(path, digest)
    facts_digest = digests.get(GROUP_FACTS_FILENAME)
    # The SHA-256 covers the index, and the index the segments' SHA-256s: equal keys
    # mean equal records (and equal finalizer maps: the group facts' index is in the key).
    key = (
        digest.sha256,
        digest.schema_version,
        digest.group_count,
        "" if facts_digest is None else facts_digest.sha256,
    )
    return data, digest, key


def _with_advertised_count(
    path: Path,
    digest: SidecarDigest,
    decoded: tuple[ParsedRolloutRecoveryState, IndexedLedger | None],
) -> tuple[ParsedRolloutRecoveryState, IndexedLedger | None]:
    groups = len(decoded[0].ledger_groups())
    if groups != digest.group_count:
        raise SnapshotCorruptError(
            path,
            f"holds {groups} groups; data_plane/metadata.json advertises {digest.group_count}",
        )
    return decoded


def _decode_indexed(
    path: Path,
    data: bytes,
    facts: LoadedFacts | None = None,
    *,
    version: int = INDEXED_SIDECAR_SCHEMA_VERSION,
) -> tuple[ParsedRolloutRecoveryState, IndexedLedger]:
    """A version 6 sidecar, or a version 7, 8 or 9 one with the finalizer maps of ``facts``,
    and its ledger segments (beside the snapshot), checked."""
    try:
        if facts is None:
            state = decode_indexed_sidecar(data)
        elif version == CATALOG_SIDECAR_SCHEMA_VERSION:
            state = decode_catalog_sidecar(
                data,
                finalizer_metrics_by_group=facts.metrics(),
                finalizer_rewards_by_group=facts.rewards(),
                read_catalog=functools.partial(read_ledger_catalog, segments_dir_for(path.parent)),
            )
        else:
            state = _SIDECAR_DECODERS[version](
                data,
                finalizer_metrics_by_group=facts.metrics(),
                finalizer_rewards_by_group=facts.rewards(),
            )
    except LedgerError as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc
    records = {
        ref.file: read_ledger_segment(segments_dir_for(path.parent) / ref.file, ref)
        for ref in state.ledger_index.segments
    }
    try:
        parsed, chains = assemble_indexed_ledger(state, records)
    except LedgerError as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc
    _require_reward_settings(path, parsed)
    return parsed, IndexedLedger(state.ledger_index, tuple(chains))


def read_ledger_catalog(segments_dir: Path, ref: LedgerCatalogRef) -> bytes:
    """The bytes of the ledger catalog ``ref`` names, refused unless they are what the sidecar
    records of them (:class:`SnapshotCorruptError` naming the catalog: missing, another size
    or SHA-256); their content is checked by the sidecar's decoder."""
    try:
        return read_recorded_segment(
            segments_dir / ref.file,
            what="ledger catalog",
            byte_size=ref.byte_size,
            sha256=ref.sha256.hex(),
            recorded_in=ROLLOUT_RECOVERY_STATE_FILENAME,
        )
    except RecordedSegmentError as exc:
        raise SnapshotCorruptError(exc.path, exc.problem) from exc


def read_ledger_segment(path: Path, ref: LedgerSegmentRef) -> SegmentRecords:
    """The records of the ledger segment ``path``, refused unless it is what ``ref`` records.

    Raises :class:`SnapshotCorruptError` naming the segment: missing, another
    size or SHA-256 (truncated, overwritten), not a ledger segment, or holding
    another number of records.
    """
    try:
        data = read_recorded_segment(
            path,
            what="ledger segment",
            byte_size=ref.byte_size,
            sha256=ref.sha256,
            recorded_in=ROLLOUT_RECOVERY_STATE_FILENAME,
        )
    except RecordedSegmentError as exc:
        raise SnapshotCorruptError(exc.path, exc.problem) from exc
    try:
        groups = decode_ledger_segment(data, name=path.name)
    except LedgerError as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc
    if len(groups) != ref.record_count:
        raise SnapshotCorruptError(
            path,
            f"holds {len(groups)} records, {ROLLOUT_RECOVERY_STATE_FILENAME} records "
            f"{ref.record_count}",
        )
    return groups


def decode_recovery_sidecar(
    path: Path, data: bytes, digest: SidecarDigest
) -> ParsedRolloutRecoveryState:
    """Decode the ledger sidecar's bytes after checking its advertised schema version.

    The advertised version must be one this build reads (an older one is
    upgraded on decode) and the sidecar's own ``schema_version`` must be it.
    """
    expected_version = digest.schema_version
    if expected_version not in SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS:
        readable = SUPPORTED_ROLLOUT_RECOVERY_SCHEMA_VERSIONS | {
            INDEXED_SIDECAR_SCHEMA_VERSION,
            *_FACTS_APART_SIDECAR_VERSIONS,
        }
        supported = ", ".join(map(str, sorted(readable)))
        raise SnapshotCorruptError(
            path,
            f"data plane metadata advertises ledger schema {expected_version}; this rollvault "
            f"reads schemas {supported}",
        )
    try:
        parsed = decode_rollout_recovery_state(data)
    except LedgerError as exc:
        raise SnapshotCorruptError(path, str(exc)) from exc
    # Decoded (so it is a valid sidecar); its version is read only now.
    written = msgspec.json.decode(data, type=_Versioned).schema_version
    if written != expected_version:
        raise SnapshotCorruptError(
            path,
            f"schema_version {written} differs from the ledger schema {expected_version} "
            "data_plane/metadata.json advertises",
        )
    _require_reward_settings(path, parsed)
    return parsed


def _require_reward_settings(path: Path, parsed: ParsedRolloutRecoveryState) -> None:
    if parsed.reward_settings is None:
        # The spec checks them "when token capture is on", and in rollvault it
        # always is: every gate writes token rows, and the checkpointer records
        # the settings in every snapshot. Without them sealed rewards could not
        # be checked against the run's, so the snapshot is not restorable.
        raise SnapshotCorruptError(
            path,
            "reward_settings is null: a snapshot of token-capture rollouts must record the "
            "reward settings its rewards were finalized under",
        )


def _decode(path: Path, name: str, raw: dict[str, bytes], kind: type[Any]) -> Any:
    try:
        decoded = msgspec.json.decode(raw[name], type=kind, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SnapshotCorruptError(path / name, str(exc)) from exc
    if decoded.schema_version != SNAPSHOT_FILES_SCHEMA_VERSION and kind is not SparePromptsState:
        raise SnapshotCorruptError(
            path / name,
            f"unsupported schema_version {decoded.schema_version} "
            f"(supported: {SNAPSHOT_FILES_SCHEMA_VERSION})",
        )
    return decoded


def _decode_controller_state(
    path: Path, raw: Mapping[str, bytes], facts: LoadedFacts | None = None
) -> ControllerStateFile:
    """``controller_state.json`` of a supported version, resolved: version 5's origins and
    prompt identities from ``facts`` (the snapshot's group facts), which only it has."""
    data = raw[CONTROLLER_STATE_FILENAME]
    file = path / CONTROLLER_STATE_FILENAME
    try:
        version = _supported_version(file, data, SUPPORTED_CONTROLLER_STATE_SCHEMA_VERSIONS)
        _require_facts_with(file, version, CONTROLLER_STATE_SCHEMA_VERSION, facts)
        if version == CONTROLLER_STATE_SCHEMA_VERSION:
            v5 = msgspec.json.decode(data, type=_ControllerStateFileV5, strict=True)
            assert facts is not None  # _require_facts_with
            return ControllerStateFile(
                **msgspec.structs.asdict(v5),
                origins=facts.origins,
                prompt_identities=facts.prompt_identities,
            )
        if version == 4:
            return msgspec.json.decode(data, type=ControllerStateFile, strict=True)
        if version == 3:
            v3 = msgspec.json.decode(data, type=_ControllerStateFileV3, strict=True)
            return ControllerStateFile(**msgspec.structs.asdict(v3), pooled_seals=[])
        if version == 2:
            v2 = msgspec.json.decode(data, type=_ControllerStateFileV2, strict=True)
            return ControllerStateFile(
                **msgspec.structs.asdict(v2), seal_journal_seq=0, pooled_seals=[]
            )
        old = msgspec.json.decode(data, type=_ControllerStateFileV1, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SnapshotCorruptError(path / CONTROLLER_STATE_FILENAME, str(exc)) from exc
    return ControllerStateFile(
        **msgspec.structs.asdict(old),
        dispatch_journal_seq=0,
        lost_interruptions=[],
        seal_journal_seq=0,
        pooled_seals=[],
    )


def _require_facts_with(
    file: Path, version: int, first_apart: int, facts: LoadedFacts | None
) -> None:
    """Versions from ``first_apart`` on keep their per-group maps in the group facts, the
    ones before hold them: a snapshot has group facts exactly when its files are the new."""
    if version >= first_apart and facts is None:
        raise SnapshotCorruptError(
            file,
            f"schema_version {version} keeps its per-group maps in {GROUP_FACTS_FILENAME}, "
            "which data_plane/metadata.json does not advertise",
        )
    if version < first_apart and facts is not None:
        raise SnapshotCorruptError(
            file,
            f"schema_version {version} holds its per-group maps itself, but "
            f"data_plane/metadata.json advertises {GROUP_FACTS_FILENAME} too",
        )


def _supported_version(file: Path, data: bytes, supported: Set[int]) -> int:
    """The ``schema_version`` of a versioned file's bytes, refused unless in ``supported``
    (raises msgspec's errors for bytes that are not such a file)."""
    version = msgspec.json.decode(data, type=_Versioned, strict=True).schema_version
    if version not in supported:
        listed = ", ".join(map(str, sorted(supported)))
        raise SnapshotCorruptError(
            file, f"unsupported schema_version {version} (supported: {listed})"
        )
    return version


def decode_replay_buffer(
    path: Path, raw: Mapping[str, bytes], facts: LoadedFacts | None
) -> ReplayBufferFile:
    """``replay_buffer_metadata.json`` of a supported version, resolved: version 2's
    canonical attempts, and version 3's entries too, from ``facts`` (the snapshot's group
    facts)."""
    data = raw[REPLAY_BUFFER_METADATA_FILENAME]
    file = path / REPLAY_BUFFER_METADATA_FILENAME
    try:
        version = _supported_version(file, data, SUPPORTED_REPLAY_BUFFER_SCHEMA_VERSIONS)
        _require_facts_with(file, version, _FIRST_REPLAY_WITH_FACTS, facts)
        if version == 1:
            return msgspec.json.decode(data, type=ReplayBufferFile, strict=True)
        if version == 2:
            v2 = msgspec.json.decode(data, type=_ReplayBufferFileV2, strict=True)
            replay = v2.replay
        else:
            v3 = msgspec.json.decode(data, type=_ReplayBufferFileV3, strict=True)
            assert facts is not None  # _require_facts_with
            try:
                entries = replay_in_order(file, facts, v3.order)
            except FactsError as exc:
                raise SnapshotCorruptError(exc.path, exc.problem) from exc
            replay = ReplayIndexState(
                schema_version=v3.index_schema_version, entries=tuple(entries)
            )
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SnapshotCorruptError(file, str(exc)) from exc
    assert facts is not None  # _require_facts_with
    return ReplayBufferFile(
        schema_version=version,
        replay=replay,
        canonical_attempts=facts.canonical_attempts(),
    )


def decode_env_rollouts(path: Path, raw: Mapping[str, bytes]) -> EnvRolloutsFile:
    """``env_rollouts.json`` checked and decoded; an older snapshot without it has none."""
    if ENV_ROLLOUTS_FILENAME not in raw:
        return empty_env_rollouts()
    try:
        decoded = msgspec.json.decode(raw[ENV_ROLLOUTS_FILENAME], type=EnvRolloutsFile, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SnapshotCorruptError(path / ENV_ROLLOUTS_FILENAME, str(exc)) from exc
    if decoded.schema_version != ENV_ROLLOUTS_SCHEMA_VERSION:
        raise SnapshotCorruptError(
            path / ENV_ROLLOUTS_FILENAME,
            f"unsupported schema_version {decoded.schema_version} "
            f"(supported: {ENV_ROLLOUTS_SCHEMA_VERSION})",
        )
    return decoded


def _check_facts_count(
    path: Path, facts: LoadedFacts | None, digests: Mapping[str, SidecarDigest]
) -> None:
    """The group facts' count, before any file resolved from them is decoded: the other
    files' counts (and version 3 replay metadata's order) come from them, and a bad index
    is their cause."""
    if facts is None:
        return
    advertised = digests[GROUP_FACTS_FILENAME].group_count
    if facts.index.live_facts != advertised:
        raise SnapshotCorruptError(
            path / GROUP_FACTS_FILENAME,
            f"holds {facts.index.live_facts} live facts; data_plane/metadata.json advertises "
            f"{advertised}",
        )


def _check_counts(snapshot: LoadedSnapshot, digests: dict[str, SidecarDigest]) -> None:
    # The sidecar's count is checked by read_recovery_sidecar_file, the group facts' by
    # _check_facts_count.
    actual = {
        REPLAY_BUFFER_METADATA_FILENAME: len(snapshot.replay.replay.entries),
        REPLACEMENT_RESERVE_FILENAME: len(snapshot.spares.prompts),
        CONTROLLER_STATE_FILENAME: len(snapshot.controller.origins),
    }
    if ENV_ROLLOUTS_FILENAME in digests:
        actual[ENV_ROLLOUTS_FILENAME] = len(snapshot.env_rollouts.episodes)
    for name, count in actual.items():
        if count != digests[name].group_count:
            raise SnapshotCorruptError(
                snapshot.path / name,
                f"holds {count} groups; data_plane/metadata.json advertises "
                f"{digests[name].group_count}",
            )
