"""The controller's per-group facts, written once per anchor into fact segments.

Two facts are set once per prompt group and never change afterwards: its
*origin* (epoch, dataset index and the identity digest of its prompt), set
at reservation, and its *finalization* (per sibling the reward after the
checks, the finalizer metrics, and the gate rollout id of each published
attempt), set when it is finalized. Snapshot files before
``controller_state.json`` version 5, ``replay_buffer_metadata.json`` version
2 and ``rollout_recovery.json`` version 7 held them in per-group maps, and
every snapshot rewrote every map whole (~450 KB at 1,024 groups, against
~600 KB of new rows per snapshot).

Now each fact is written once per anchor into a **fact segment**
(``<anchor>/rollout_snapshots/segments/<seq>-facts.facts-segment.msgpack``,
form 2 of :mod:`.fact_forms`; form 1, ``.json``, is still read; published
durably before the snapshot that references it commits), the way rows and
ledger records are, and each snapshot holds only an index, ``group_facts.json``
(:class:`~.fact_index.GroupFactsFile`): the segments it references, each with its
SHA-256, size and fact count, and which of its facts are live (version 3, written: a
compact row in the data plane's ``metadata.json`` version 3 forms,
:class:`~.fact_index.FactSegmentEntryV3`; version 2, read: a bitmap over the
segment's ordinals, :func:`~rollvault.dataplane.live_ordinals.encode_live_bitmap`,
and the live count). The files that held the maps no longer do;
:mod:`.snapshot_files` resolves the index and gives restore the same maps as before.
Since index version 2 the replay index's entries are facts too (a canonical group's
entry is set when it is finalized and never changes while it waits): version 3 of
``replay_buffer_metadata.json`` holds only their order
(:func:`~.fact_writer.replay_order_runs`), not ~160 bytes per waiting group every
snapshot.

The index file is :mod:`.fact_index`, the writer :mod:`.fact_writer`. This module
reads a snapshot's live facts (:func:`read_group_facts`): every segment its index
references, each checked whole against what the index records; it raises
:class:`~.fact_index.FactsError` naming the file, which the snapshot layer reports as
a corrupt snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollvault.controller.data.replay_index import ReplayEntry
from rollvault.controller.loop.parts import FinalizedGroup, GroupOrigin
from rollvault.controller.snapshots.fact_forms import (
    FACT_SEGMENT_FORMAT,
    JSON_FACT_SEGMENT_FORMAT,
    JSON_FACT_SEGMENT_SUFFIX,
    Fact,
    FactFormError,
    FinalizedFact,
    OriginFact,
    ReplayFact,
    decode_fact_segment,
)
from rollvault.controller.snapshots.fact_index import (
    GROUP_FACTS_FILENAME,
    FactSegmentRef,
    FactsError,
    GroupFactsFile,
    decode_group_facts_file,
)
from rollvault.dataplane.live_ordinals import decode_live_bitmap
from rollvault.durable.segment_store import (
    RecordedSegmentError,
    read_recorded_segment,
)
from rollvault.ledger.reward_penalties import FinalizedReward


@dataclass(frozen=True)
class LoadedFacts:
    """A snapshot's live facts, checked, and where each is (to seed the next writer)."""

    index: GroupFactsFile
    origins: dict[str, GroupOrigin]
    prompt_identities: dict[str, str]
    finalized: dict[str, FinalizedGroup]
    origin_at: dict[str, tuple[str, int]]
    finalized_at: dict[str, tuple[str, int]]
    replay: list[ReplayEntry] = field(default_factory=list)
    """The live replay entries in the order the reader meets them (segments by file name,
    then ordinal): ``replay_buffer_metadata.json`` version 3 orders them."""
    replay_at: dict[str, tuple[str, int]] = field(default_factory=dict)

    def canonical_attempts(self) -> dict[str, list[str]]:
        """Per finalized group, the gate rollout id of each sibling's published attempt."""
        return {g: list(f.gate_rollout_ids) for g, f in self.finalized.items()}

    def rewards(self) -> dict[str, list[FinalizedReward]]:
        """Per finalized group, each sibling's reward after the checks and penalties."""
        return {g: list(f.rewards) for g, f in self.finalized.items()}

    def metrics(self) -> dict[str, dict[str, float]]:
        """Per finalized group, the finalizer metrics."""
        return {g: f.metrics_dict() for g, f in self.finalized.items()}


def read_fact_segment(path: Path, ref: FactSegmentRef) -> list[Fact]:
    """The facts of the segment ``path``, refused unless it is what ``ref`` records.

    Its form is its name's: ``*.facts-segment.json`` form 1, ``*.msgpack`` form 2.
    """
    try:
        data = read_recorded_segment(
            path,
            what="fact segment",
            byte_size=ref.byte_size,
            sha256=ref.sha256,
            recorded_in=GROUP_FACTS_FILENAME,
        )
    except RecordedSegmentError as exc:
        raise FactsError(exc.path, exc.problem) from exc
    form = (
        JSON_FACT_SEGMENT_FORMAT
        if path.name.endswith(JSON_FACT_SEGMENT_SUFFIX)
        else FACT_SEGMENT_FORMAT
    )
    try:
        facts = decode_fact_segment(data, form=form)
    except FactFormError as exc:
        raise FactsError(path, str(exc)) from exc
    if len(facts) != ref.fact_count:
        raise FactsError(
            path,
            f"holds {len(facts)} facts, {GROUP_FACTS_FILENAME} records {ref.fact_count}",
        )
    return facts


def read_group_facts(path: Path, data: bytes, segments_dir: Path) -> LoadedFacts:
    """The live facts the index ``path`` (whose checked bytes are ``data``) references.

    Every referenced segment in ``segments_dir`` is read and checked whole;
    a group's origin, finalization or replay entry live twice is refused. Raises
    :class:`~.fact_index.FactsError` naming the index or the segment.
    """
    index = decode_group_facts_file(path, data, segments_dir)
    origins: dict[str, GroupOrigin] = {}
    identities: dict[str, str] = {}
    finalized: dict[str, FinalizedGroup] = {}
    replay: list[ReplayEntry] = []
    where: dict[type, dict[str, tuple[str, int]]] = {
        OriginFact: {},
        FinalizedFact: {},
        ReplayFact: {},
    }
    for position, ref in enumerate(index.segments):
        try:
            wanted = decode_live_bitmap(
                ref.live, ref.fact_count, ref.live_facts, noun="fact", live_field="live_facts"
            )
        except ValueError as exc:
            raise FactsError(path, f"$.segments[{position}].live: {exc}") from exc
        segment_path = segments_dir / ref.file
        facts = read_fact_segment(segment_path, ref)
        for ordinal, fact in enumerate(facts):
            if not wanted[ordinal]:
                continue
            group_id = fact.group_id
            at = where[type(fact)]
            if group_id in at:
                raise FactsError(
                    segment_path,
                    f"fact {ordinal}: group {group_id!r}'s {type(fact).__name__} is also live "
                    f"in {at[group_id][0]!r}",
                )
            at[group_id] = (ref.file, ordinal)
            if isinstance(fact, OriginFact):
                origins[group_id] = GroupOrigin(epoch=fact.epoch, dataset_idx=fact.dataset_idx)
                if fact.prompt_identity is not None:
                    identities[group_id] = fact.prompt_identity
            elif isinstance(fact, FinalizedFact):
                finalized[group_id] = FinalizedGroup.of(
                    rewards=fact.rewards,
                    metrics=fact.metrics,
                    gate_rollout_ids=fact.gate_rollout_ids,
                )
            else:
                replay.append(fact.entry())
    return LoadedFacts(
        index,
        origins,
        identities,
        finalized,
        where[OriginFact],
        where[FinalizedFact],
        replay,
        where[ReplayFact],
    )


def replay_in_order(
    path: Path, facts: LoadedFacts, runs: Sequence[tuple[int, int]]
) -> list[ReplayEntry]:
    """The live replay entries of ``facts`` in the order ``runs`` (from ``path``, a
    ``replay_buffer_metadata.json`` of version 3) gives them: every live entry exactly once.

    Raises :class:`~.fact_index.FactsError` naming ``path``.
    """
    positions = [start + n for start, count in runs for n in range(count)]
    if sorted(positions) != list(range(len(facts.replay))):
        raise FactsError(
            path,
            f"$.order: runs over {len(positions)} positions are not each of the "
            f"{len(facts.replay)} live replay entries in {GROUP_FACTS_FILENAME} once",
        )
    return [facts.replay[position] for position in positions]
