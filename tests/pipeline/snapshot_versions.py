"""Older rollout-recovery sidecar versions, made from snapshots today's code writes.

rollvault never wrote a version 3 writer after version 4 came: the only
difference is that version 4 attempts carry ``failure_kind``
(:mod:`rollvault.ledger.state_schema`). A version 3 sidecar is therefore
today's sidecar with ``failure_kind`` removed from every attempt and both
schema versions set to 3; the data plane's metadata then advertises the new
bytes' SHA-256 and schema 3, as a version 3 writer's did.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Final

import msgspec
from data_plane_v2 import index_as_version_2, index_as_version_3, index_as_version_4
from ledger_form2 import RecordOut, compact_sibling, encode_form_2_segment, encode_piece

from rollvault.controller.snapshots.fact_forms import (
    FinalizedFact,
    OriginFact,
    encode_json_fact_segment,
)
from rollvault.controller.snapshots.fact_index import GROUP_FACTS_FILENAME
from rollvault.controller.snapshots.fact_segments import LoadedFacts, replay_in_order
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    DATA_PLANE_DIRNAME,
    ENV_ROLLOUTS_FILENAME,
    ENV_ROLLOUTS_SCHEMA_VERSION,
    REPLAY_BUFFER_METADATA_FILENAME,
    SIDECARS_METADATA_KEY,
    empty_env_rollouts,
    read_facts,
    read_ledger_catalog,
    read_ledger_segment,
    segments_dir_for,
)
from rollvault.dataplane.checkpoint_format import (
    decode_envelope,
    replace_user_metadata,
    sha256_hex,
)
from rollvault.dataplane.live_ordinals import encode_live_bitmap
from rollvault.ledger.indexed_sidecar import (
    CATALOG_SIDECAR_SCHEMA_VERSION,
    COMPACT_SIDECAR_SCHEMA_VERSION,
    FACTS_APART_SIDECAR_SCHEMA_VERSION,
    INDEXED_SIDECAR_SCHEMA_VERSION,
    RUNS_SIDECAR_SCHEMA_VERSION,
    LedgerCatalogIndex,
    LedgerSegmentEntryV9,
    assemble_indexed_sidecar,
    catalog_segment_refs,
    decode_indexed_sidecar,
)
from rollvault.ledger.ledger_records import (
    PackedRecordOut,
    encode_packed_record,
    encode_packed_segment,
)
from rollvault.ledger.packed_groups import pack_attempt, pack_header
from rollvault.ledger.sidecar import ROLLOUT_RECOVERY_STATE_FILENAME
from rollvault.ledger.state_convert import group_header_to_state
from rollvault.ledger.state_load import records_from_state
from rollvault.ledger.state_schema import LedgerState
from rollvault.ledger.statuses import AttemptFailureKind

V3: Final = 3
V4: Final = 4
V5: Final = 5
_METADATA: Final = "metadata.json"


def downgrade_sidecar_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    """A version 5 sidecar (builtins) as the version 4 writer wrote it.

    Version 5 adds ``turn_keys`` and ``env_state_revision`` to attempts. A
    version 4 writer staged the same rows without committing them, so the
    turns simply go (a restore of version 4 redoes an unsealed attempt whole).
    """
    if state["schema_version"] != 5:
        raise ValueError(f"expected a version 5 sidecar, got {state['schema_version']}")
    old = json.loads(json.dumps(state))
    old["schema_version"] = V4
    old["ledger"]["schema_version"] = V4
    for group in old["ledger"]["groups"]:
        for sibling in group["siblings"]:
            for attempt in sibling["attempts"]:
                del attempt["turn_keys"], attempt["env_state_revision"]
    return old


def downgrade_sidecar_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    """A version 5 or 4 sidecar (builtins) as the version 3 writer wrote it.

    Refuses an attempt failed as ``interrupted``: version 3 had no such kind
    (its reasons start with ``infra:`` or ``data:``), so no version 3 sidecar
    can hold one.
    """
    if state["schema_version"] == 5:
        state = downgrade_sidecar_to_v4(state)
    if state["schema_version"] != 4:
        raise ValueError(f"expected a version 4 sidecar, got {state['schema_version']}")
    old = json.loads(json.dumps(state))
    old["schema_version"] = V3
    old["ledger"]["schema_version"] = V3
    for group in old["ledger"]["groups"]:
        for sibling in group["siblings"]:
            for attempt in sibling["attempts"]:
                if attempt["failure_kind"] == AttemptFailureKind.INTERRUPTED.value:
                    raise ValueError(
                        f"group {group['group_id']}: an interrupted attempt has no version 3 form"
                    )
                del attempt["failure_kind"]
    return old


def rewrite_sidecar(snapshot: Path, state: dict[str, Any]) -> None:
    """Write ``state`` as the snapshot's sidecar and advertise it in the data plane's metadata."""
    data = msgspec.json.Encoder(order="sorted").encode(state)
    (snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).write_bytes(data)
    advertise_sidecar(snapshot, sha256=sha256_hex(data), schema_version=state["schema_version"])


def advertise_sidecar(snapshot: Path, *, sha256: str | None = None, schema_version: int) -> None:
    """Make the data plane's metadata advertise this about the sidecar (checksum kept valid)."""
    metadata_path = snapshot / DATA_PLANE_DIRNAME / _METADATA
    user_metadata = _user_metadata(metadata_path)
    advertised = user_metadata[SIDECARS_METADATA_KEY][ROLLOUT_RECOVERY_STATE_FILENAME]
    if sha256 is not None:
        advertised["sha256"] = sha256
    advertised["schema_version"] = schema_version
    data = replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    metadata_path.write_bytes(data)


def _user_metadata(metadata_path: Path) -> dict[str, Any]:
    """The ``user_metadata`` of a data-plane ``metadata.json`` of either version, as builtins."""
    _version, content = decode_envelope(metadata_path.read_bytes(), metadata_path)
    user_metadata: dict[str, Any] = json.loads(content)["user_metadata"]
    return user_metadata


def sidecar_as_version_9(state: dict[str, Any], snapshot: Path) -> dict[str, Any]:
    """A sidecar (builtins) of ``snapshot``; a version 10 one as version 9, what main wrote
    before it: each segment's row, read from its catalog, in the index itself (any other
    version as it is)."""
    if state["schema_version"] != CATALOG_SIDECAR_SCHEMA_VERSION:
        return state
    index = state["ledger_index"]
    decoded = msgspec.json.decode(msgspec.json.encode(index), type=LedgerCatalogIndex)
    reader = functools.partial(read_ledger_catalog, segments_dir_for(snapshot))
    rows = [LedgerSegmentEntryV9.of(ref) for ref in catalog_segment_refs(decoded, reader)]
    ledger_index = {"segments": msgspec.to_builtins(rows), "runs": index["runs"]}
    return dict(state, schema_version=COMPACT_SIDECAR_SCHEMA_VERSION, ledger_index=ledger_index)


def sidecar_as_version_8(state: dict[str, Any]) -> dict[str, Any]:
    """A sidecar (builtins); a version 9 one as version 8, what main wrote before it: each
    segment a row naming its file, with the hex digest (any other version as it is)."""
    if state["schema_version"] != COMPACT_SIDECAR_SCHEMA_VERSION:
        return state
    index = state["ledger_index"]
    rows = [
        msgspec.json.decode(msgspec.json.encode(row), type=LedgerSegmentEntryV9).ref()
        for row in index["segments"]
    ]
    segments = [[ref.file, ref.sha256, ref.byte_size, ref.record_count] for ref in rows]
    ledger_index = dict(index, segments=segments)
    return dict(state, schema_version=RUNS_SIDECAR_SCHEMA_VERSION, ledger_index=ledger_index)


def sidecar_as_version_7(state: dict[str, Any]) -> dict[str, Any]:
    """A sidecar (builtins); a version 8 or 9 one as version 7: its index's runs as the pairs
    they stand for, its segments as objects (any other version as it is)."""
    state = sidecar_as_version_8(state)
    if state["schema_version"] != RUNS_SIDECAR_SCHEMA_VERSION:
        return state
    index = state["ledger_index"]
    groups = [
        [segment, ordinal]
        for segment, first, count in index["runs"]
        for ordinal in range(first, first + count)
    ]
    fields = ("file", "sha256", "byte_size", "record_count")
    segments = [dict(zip(fields, row, strict=True)) for row in index["segments"]]
    ledger_index = {"segments": segments, "groups": groups}
    return dict(state, schema_version=FACTS_APART_SIDECAR_SCHEMA_VERSION, ledger_index=ledger_index)


def read_sidecar_json(snapshot: Path) -> dict[str, Any]:
    """The snapshot's sidecar as builtins, a version 8, 9 or 10 one as version 7."""
    state = json.loads((snapshot / ROLLOUT_RECOVERY_STATE_FILENAME).read_bytes())
    return sidecar_as_version_7(sidecar_as_version_9(state, snapshot))


def read_sidecar(snapshot: Path) -> dict[str, Any]:
    """The snapshot's sidecar as builtins, undecoded; a version 6 one as version 5 (inline).

    :func:`rewrite_sidecar` of the result is what the writer before ledger
    segments wrote: every group in the sidecar itself.
    """
    state = read_sidecar_json(snapshot)
    if state["schema_version"] == FACTS_APART_SIDECAR_SCHEMA_VERSION:
        state = sidecar_with_finalizer_maps(state, group_facts(snapshot))
    if state["schema_version"] == INDEXED_SIDECAR_SCHEMA_VERSION:
        state = inline_sidecar(snapshot, state)
    return state


def group_facts(snapshot: Path) -> LoadedFacts:
    """The snapshot's group facts, read and checked as restore reads them."""
    raw = {GROUP_FACTS_FILENAME: (snapshot / GROUP_FACTS_FILENAME).read_bytes()}
    facts = read_facts(snapshot, raw)
    assert facts is not None
    return facts


def sidecar_with_finalizer_maps(state: dict[str, Any], facts: LoadedFacts) -> dict[str, Any]:
    """A version 7 sidecar (builtins) as version 6: the finalizer maps back in it."""
    old = dict(state, schema_version=INDEXED_SIDECAR_SCHEMA_VERSION)
    old["finalizer_rewards_by_group"] = msgspec.to_builtins(facts.rewards())
    old["finalizer_metrics_by_group"] = facts.metrics()
    return old


def facts_to_inline(snapshot: Path) -> None:
    """Turn a snapshot with group facts into the one the writer before them wrote.

    ``controller_state.json`` version 4 holds the origins and prompt
    identities, ``replay_buffer_metadata.json`` version 1 the canonical
    attempts, and the version 6 sidecar the finalizer maps; there is no
    ``group_facts.json``. The fact segments stay on disk, referenced by none.
    """
    facts = group_facts(snapshot)
    encode = msgspec.json.Encoder(order="sorted").encode
    state = read_sidecar_json(snapshot)
    if state["schema_version"] != FACTS_APART_SIDECAR_SCHEMA_VERSION:
        raise ValueError(f"expected a version 7, 8 or 9 sidecar, got {state['schema_version']}")
    rewrite_sidecar(snapshot, sidecar_with_finalizer_maps(state, facts))
    controller = json.loads((snapshot / CONTROLLER_STATE_FILENAME).read_bytes())
    controller.update(
        schema_version=4,
        origins=msgspec.to_builtins(facts.origins),
        prompt_identities=facts.prompt_identities,
    )
    replay = replay_entries_inline(snapshot)
    replay.update(schema_version=1, canonical_attempts=facts.canonical_attempts())
    metadata_path = snapshot / DATA_PLANE_DIRNAME / _METADATA
    user_metadata = _user_metadata(metadata_path)
    advertised = user_metadata[SIDECARS_METADATA_KEY]
    for name, content in (
        (CONTROLLER_STATE_FILENAME, controller),
        (REPLAY_BUFFER_METADATA_FILENAME, replay),
    ):
        data = encode(content)
        (snapshot / name).write_bytes(data)
        advertised[name].update(sha256=sha256_hex(data), schema_version=content["schema_version"])
    del advertised[GROUP_FACTS_FILENAME]
    (snapshot / GROUP_FACTS_FILENAME).unlink()
    data = replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    metadata_path.write_bytes(data)


def replay_entries_inline(snapshot: Path) -> dict[str, Any]:
    """The snapshot's ``replay_buffer_metadata.json`` as builtins, a version 3 one as
    version 2: its entries, resolved from the group facts in its order, back in it."""
    replay: dict[str, Any] = json.loads((snapshot / REPLAY_BUFFER_METADATA_FILENAME).read_bytes())
    if replay["schema_version"] != 3:
        return replay
    runs = [(first, count) for first, count in replay["order"]]
    entries = replay_in_order(
        snapshot / REPLAY_BUFFER_METADATA_FILENAME, group_facts(snapshot), runs
    )
    return {
        "schema_version": 2,
        "replay": {
            "schema_version": replay["index_schema_version"],
            "entries": msgspec.to_builtins(entries),
        },
    }


def facts_to_form_1(snapshot: Path) -> str:
    """Turn a snapshot's group facts into what the writer before fact segment form 2 wrote.

    Its live origins and finalizations go into one form 1 (JSON) segment,
    ``<snapshot>-form1.facts-segment.json``, that a version 1 ``group_facts.json``
    lists alone; its replay entries go back into ``replay_buffer_metadata.json``
    version 2. Returns the segment's name; the segments referenced before stay on disk.
    """
    facts = group_facts(snapshot)
    replay = replay_entries_inline(snapshot)
    form_1: list[OriginFact | FinalizedFact] = [
        OriginFact(g, origin.epoch, origin.dataset_idx, facts.prompt_identities.get(g))
        for g, origin in sorted(facts.origins.items())
    ]
    form_1 += [
        FinalizedFact(g, list(f.rewards), f.metrics_dict(), list(f.gate_rollout_ids))
        for g, f in sorted(facts.finalized.items())
    ]
    data = encode_json_fact_segment(form_1)
    name = f"{snapshot.name}-form1.facts-segment.json"
    (segments_dir_for(snapshot) / name).write_bytes(data)
    index = {
        "schema_version": 1,
        "segments": [
            {
                "file": name,
                "sha256": sha256_hex(data),
                "byte_size": len(data),
                "fact_count": len(form_1),
                "live_facts": len(form_1),
                "live": encode_live_bitmap(len(form_1), range(len(form_1))),
            }
        ],
    }
    encode = msgspec.json.Encoder(order="sorted").encode
    metadata_path = snapshot / DATA_PLANE_DIRNAME / _METADATA
    user_metadata = _user_metadata(metadata_path)
    advertised = user_metadata[SIDECARS_METADATA_KEY]
    for name_, content, count in (
        (GROUP_FACTS_FILENAME, index, len(form_1)),
        (REPLAY_BUFFER_METADATA_FILENAME, replay, len(replay["replay"]["entries"])),
    ):
        written = encode(content)
        (snapshot / name_).write_bytes(written)
        advertised[name_].update(
            sha256=sha256_hex(written), schema_version=content["schema_version"], group_count=count
        )
    metadata = replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    metadata_path.write_bytes(metadata)
    return name


def inline_sidecar(snapshot: Path, state: dict[str, Any]) -> dict[str, Any]:
    """A version 6 (or 7) sidecar (builtins) with its records read from its ledger segments,
    as 5."""
    if state["schema_version"] == FACTS_APART_SIDECAR_SCHEMA_VERSION:
        state = sidecar_with_finalizer_maps(state, group_facts(snapshot))
    inline = dict(state)
    del inline["ledger_index"]
    typed = decode_indexed_sidecar(msgspec.json.encode(state))
    segments = {
        ref.file: read_ledger_segment(segments_dir_for(snapshot) / ref.file, ref)
        for ref in typed.ledger_index.segments
    }
    # Delta records resolved: each group whole, as the version 5 sidecar held it.
    groups = list(assemble_indexed_sidecar(typed, segments).ledger_state["groups"])
    inline["schema_version"] = V5
    inline["ledger"] = {"schema_version": V5, "groups": groups}
    return inline


def downgrade_snapshot_to_v3(snapshot: Path) -> None:
    """Turn a snapshot today's code wrote into the one a version 3 writer wrote."""
    if (snapshot / GROUP_FACTS_FILENAME).exists():
        facts_to_inline(snapshot)
    rewrite_sidecar(snapshot, downgrade_sidecar_to_v3(read_sidecar(snapshot)))


def upgrade_snapshot_v4_to_v5(snapshot: Path) -> None:
    """Turn a version 4 snapshot into the one the version 5 writer wrote of the same state.

    Version 5 attempts carry ``turn_keys`` (none) and ``env_state_revision`` (0),
    and the snapshot has an ``env_rollouts.json`` with no episode in flight,
    advertised in the data plane's metadata like every sidecar.
    """
    state = read_sidecar(snapshot)
    if state["schema_version"] != V4:
        raise ValueError(f"expected a version 4 sidecar, got {state['schema_version']}")
    state["schema_version"] = state["ledger"]["schema_version"] = 5
    for group in state["ledger"]["groups"]:
        for sibling in group["siblings"]:
            for attempt in sibling["attempts"]:
                attempt["turn_keys"] = []
                attempt["env_state_revision"] = 0
    rewrite_sidecar(snapshot, state)
    env = msgspec.json.Encoder(order="sorted").encode(empty_env_rollouts())
    (snapshot / ENV_ROLLOUTS_FILENAME).write_bytes(env)
    metadata_path = snapshot / DATA_PLANE_DIRNAME / _METADATA
    user_metadata = _user_metadata(metadata_path)
    user_metadata[SIDECARS_METADATA_KEY][ENV_ROLLOUTS_FILENAME] = {
        "sha256": sha256_hex(env),
        "schema_version": ENV_ROLLOUTS_SCHEMA_VERSION,
        "group_count": 0,
    }
    data = replace_user_metadata(metadata_path.read_bytes(), metadata_path, user_metadata)
    metadata_path.write_bytes(data)


def inline_snapshot_to_v5(snapshot: Path) -> None:
    """Turn a version 6 snapshot into the one the writer before ledger segments wrote.

    Its ledger segments stay on disk, referenced by no version 5 sidecar (and its group
    facts, if any, go back into its files, as that writer wrote them).
    """
    if (snapshot / GROUP_FACTS_FILENAME).exists():
        facts_to_inline(snapshot)
    state = read_sidecar(snapshot)
    if state["schema_version"] != V5:
        raise ValueError(f"expected a version 6 (or 5) sidecar, got {state['schema_version']}")
    rewrite_sidecar(snapshot, state)


def ledger_segments_to_form_1(snapshot: Path) -> str:
    """Rewrite a version 6 snapshot's ledger as the first writer of ledger segments wrote it.

    Its live groups, resolved, go whole into one form 1 segment (a version 5
    ledger state, ``<stem>-form1.ledger-segment.json``) and the index lists
    only that one; returns its name. The segments the snapshot referenced
    before stay on disk (retention's business).
    """
    state = read_sidecar_json(snapshot)
    groups = inline_sidecar(snapshot, state)["ledger"]["groups"]
    data = msgspec.json.Encoder(order="sorted").encode({"schema_version": V5, "groups": groups})
    name = f"{snapshot.name}-form1.ledger-segment.json"
    (segments_dir_for(snapshot) / name).write_bytes(data)
    ref = {"file": name, "sha256": sha256_hex(data), "byte_size": len(data)}
    state["ledger_index"] = {
        "segments": [{**ref, "record_count": len(groups)}],
        "groups": [[0, ordinal] for ordinal in range(len(groups))],
    }
    rewrite_sidecar(snapshot, state)
    return name


def ledger_segments_to_form_2(snapshot: Path) -> str:
    """Rewrite a version 6 snapshot's ledger as the form 2 writer (JSON, delta records of
    whole siblings) wrote it; returns the segment's name.

    Its live groups, resolved, go whole into one form 2 segment
    (``<stem>-form2.ledger-segment.json``); the first group's index entry is a
    delta on its whole record holding its header and first sibling again, so
    a form 2 chain is read too. The segments the snapshot referenced before
    stay on disk (retention's business).
    """
    state = read_sidecar_json(snapshot)
    groups = inline_sidecar(snapshot, state)["ledger"]["groups"]
    records = records_from_state(
        msgspec.convert({"schema_version": V5, "groups": groups}, LedgerState)
    )
    out = []
    for record in records.values():
        siblings = [compact_sibling(record.group_id, sibling) for sibling in record.siblings]
        out.append(
            RecordOut(
                base=None,
                header=msgspec.Raw(encode_piece(group_header_to_state(record))),
                siblings=[(i, msgspec.Raw(encode_piece(s))) for i, s in enumerate(siblings)],
            )
        )
    first = out[0]
    out.append(RecordOut(base=(0, 0), header=first.header, siblings=first.siblings[:1]))
    name = f"{snapshot.name}-form2.ledger-segment.json"
    data = encode_form_2_segment([name], out)
    (segments_dir_for(snapshot) / name).write_bytes(data)
    ref = {"file": name, "sha256": sha256_hex(data), "byte_size": len(data)}
    state["ledger_index"] = {
        "segments": [{**ref, "record_count": len(out)}],
        "groups": [[0, len(out) - 1]] + [[0, ordinal] for ordinal in range(1, len(groups))],
    }
    rewrite_sidecar(snapshot, state)
    return name


def ledger_segments_to_form_3(snapshot: Path) -> str:
    """Rewrite a version 6 snapshot's ledger as the form 3 writer (msgpack, deltas of whole
    attempts and headers: no status or header-field patch) wrote it; returns the segment's
    name.

    As :func:`ledger_segments_to_form_2`: the live groups go whole into one form 3
    segment (``<stem>-form3.ledger-segment.msgpack``), and the first group's index
    entry is a form 3 delta on its whole record (its header and first sibling again).
    """
    state = read_sidecar_json(snapshot)
    groups = inline_sidecar(snapshot, state)["ledger"]["groups"]
    records = records_from_state(
        msgspec.convert({"schema_version": V5, "groups": groups}, LedgerState)
    )
    out = []
    for record in records.values():
        siblings = [
            [
                msgspec.Raw(pack_attempt(f"{record.group_id}_g{s.generation_index}_a", a))
                for a in s.attempts
            ]
            for s in record.siblings
        ]
        out.append(
            PackedRecordOut(
                base=None,
                header=msgspec.Raw(pack_header(record)),
                siblings=[(i, 0, attempts) for i, attempts in enumerate(siblings)],
            )
        )
    first = out[0]
    out.append(PackedRecordOut(base=(0, 0), header=first.header, siblings=first.siblings[:1]))
    name = f"{snapshot.name}-form3.ledger-segment.msgpack"
    data = encode_packed_segment([name], [encode_packed_record(r) for r in out], form=3)
    (segments_dir_for(snapshot) / name).write_bytes(data)
    ref = {"file": name, "sha256": sha256_hex(data), "byte_size": len(data)}
    state["ledger_index"] = {
        "segments": [{**ref, "record_count": len(out)}],
        "groups": [[0, len(out) - 1]] + [[0, ordinal] for ordinal in range(1, len(groups))],
    }
    rewrite_sidecar(snapshot, state)
    return name


def data_plane_index_to_version_2(snapshot: Path) -> None:
    """Rewrite the snapshot's ``data_plane/metadata.json`` as version 2 lists the same
    index, as the writer before version 3 wrote it; the sidecars it advertises stay as
    they are."""
    index_as_version_2(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))


def data_plane_index_to_version_4(snapshot: Path) -> None:
    """Rewrite the snapshot's ``data_plane/metadata.json`` as version 4 lists the same
    index (an entry per held segment, the same catalogs), as main's writer before version 5
    wrote it; the sidecars it advertises stay as they are."""
    index_as_version_4(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))


def data_plane_index_to_version_3(snapshot: Path) -> None:
    """Rewrite the snapshot's ``data_plane/metadata.json`` as version 3 lists the same
    index (no catalogs), as main's writer before version 4 wrote it; the sidecars it
    advertises stay as they are."""
    index_as_version_3(snapshot / DATA_PLANE_DIRNAME, segments_dir_for(snapshot))
