"""controller_state.json: version 5 keeps the origins and prompt identities in the group
facts, version 4 carries the pooled journaled seals, version 3 the seal journal position,
version 2 the dispatch journal's; versions 1 to 4 still load."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from rollvault.config.schema import SamplerKind
from rollvault.controller.data.dataloader import DataLoaderState
from rollvault.controller.data.sampler import SamplerState
from rollvault.controller.loop.dispatch_journal import LostGroupInterruption
from rollvault.controller.loop.journal_rows import encode_row
from rollvault.controller.loop.parts import GroupOrigin
from rollvault.controller.loop.seal_journal import SealRecord
from rollvault.controller.snapshots.fact_index import GroupFactsFile
from rollvault.controller.snapshots.fact_segments import LoadedFacts
from rollvault.controller.snapshots.snapshot_files import (
    CONTROLLER_STATE_FILENAME,
    CONTROLLER_STATE_SCHEMA_VERSION,
    ControllerStateFile,
    SnapshotCorruptError,
    _decode_controller_state,
)

LOST = LostGroupInterruption(
    group_id="lost",
    epoch=1,
    dataset_idx=3,
    generation_index=2,
    attempt_uuid=uuid.uuid4().hex,
    reason="interrupted: test",
)

POOLED = SealRecord(
    group_id="lost",
    generation_index=2,
    gate_rollout_id="lost_g2_a" + "cd" * 16,
    epoch=1,
    dataset_idx=3,
    target_step=4,
    receipt={"gate_rollout_id": "lost_g2_a" + "cd" * 16, "staging_keys": ["k/0"]},
    reward=1.1,
    mask_sample=False,
    reward_checks=None,
    reward_log_context=None,
    rows={"k/0": encode_row({"input_ids": np.arange(5, dtype=np.int64), "reward": 1.1})},
    num_tokens=3,
    checks=None,
)


FACTS = LoadedFacts(
    index=GroupFactsFile(schema_version=1, segments=[]),
    origins={"g": GroupOrigin(epoch=1, dataset_idx=5)},
    prompt_identities={"g": "ab" * 16},
    finalized={},
    origin_at={},
    finalized_at={},
)


def current() -> ControllerStateFile:
    """The content as every version decodes to it (version 4's fields)."""
    return ControllerStateFile(
        schema_version=4,
        sampler=SamplerState(
            kind=SamplerKind.IN_ORDER, epoch=1, sampler_dispatch_index=9, next_stamp_index=9
        ),
        dataloader=DataLoaderState(epoch=1, position=4),
        origins={"g": GroupOrigin(epoch=1, dataset_idx=5)},
        prompt_identities={"g": "ab" * 16},
        log_sequence=42,
        dispatch_journal_seq=17,
        lost_interruptions=[LOST],
        seal_journal_seq=23,
        pooled_seals=[POOLED],
    )


def decode(state: dict[str, object], facts: LoadedFacts | None = None) -> ControllerStateFile:
    raw = {CONTROLLER_STATE_FILENAME: json.dumps(state).encode()}
    return _decode_controller_state(Path("snap"), raw, facts)


def version_5() -> dict[str, Any]:
    """A version 5 file of ``current()``: what the writer writes, the maps left out."""
    state = msgspec.to_builtins(current())
    del state["origins"], state["prompt_identities"]
    state["schema_version"] = CONTROLLER_STATE_SCHEMA_VERSION
    return state


def test_version_5_takes_the_origins_and_identities_from_the_group_facts() -> None:
    assert CONTROLLER_STATE_SCHEMA_VERSION == 5
    loaded = decode(version_5(), FACTS)
    assert msgspec.structs.replace(loaded, schema_version=4) == current()
    with pytest.raises(SnapshotCorruptError, match="does not advertise"):
        decode(version_5())  # the maps are nowhere
    with_maps = dict(version_5(), origins={}, prompt_identities={})
    with pytest.raises(SnapshotCorruptError, match="unknown field `origins`"):
        decode(with_maps, FACTS)
    with pytest.raises(SnapshotCorruptError, match="advertises group_facts.json too"):
        decode(msgspec.to_builtins(current()), FACTS)  # version 4 holds them itself


def test_version_4_round_trips_with_the_pooled_seals_rows() -> None:
    state = msgspec.to_builtins(current())
    assert state["schema_version"] == 4
    assert decode(state) == current()
    (row,) = decode(state).pooled_seals[0].rows.values()
    assert msgspec.json.decode(msgspec.json.encode(row)) == msgspec.to_builtins(row)


def test_a_version_3_file_loads_with_no_pooled_seal() -> None:
    old = msgspec.to_builtins(current())
    del old["pooled_seals"]
    old["schema_version"] = 3
    loaded = decode(old)
    assert loaded.pooled_seals == []
    assert msgspec.structs.replace(loaded, schema_version=4, pooled_seals=[POOLED]) == current()


def test_a_version_2_file_loads_reflecting_no_seal_journal() -> None:
    old = msgspec.to_builtins(current())
    del old["seal_journal_seq"], old["pooled_seals"]
    old["schema_version"] = 2
    loaded = decode(old)
    assert loaded.seal_journal_seq == 0
    assert (
        msgspec.structs.replace(
            loaded, schema_version=4, seal_journal_seq=23, pooled_seals=[POOLED]
        )
        == current()
    )


def test_a_version_1_file_loads_reflecting_no_journal_and_no_pending_interruption() -> None:
    old = msgspec.to_builtins(current())
    del old["dispatch_journal_seq"], old["lost_interruptions"], old["seal_journal_seq"]
    del old["pooled_seals"]
    old["schema_version"] = 1
    loaded = decode(old)
    assert (loaded.dispatch_journal_seq, loaded.lost_interruptions) == (0, [])
    assert (
        msgspec.structs.replace(
            loaded,
            schema_version=4,
            dispatch_journal_seq=17,
            lost_interruptions=[LOST],
            seal_journal_seq=23,
            pooled_seals=[POOLED],
        )
        == current()
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s.update(schema_version=6),
            "unsupported schema_version 6 (supported: 1, 2, 3, 4, 5)",
        ),
        (lambda s: s.pop("pooled_seals"), "missing required field `pooled_seals`"),
        (lambda s: s.update(schema_version=3), "unknown field `pooled_seals`"),
        (lambda s: s.pop("dispatch_journal_seq"), "missing required field `dispatch_journal_seq`"),
        (lambda s: s.pop("seal_journal_seq"), "missing required field `seal_journal_seq`"),
        (lambda s: s.update(schema_version=2), "unknown field `"),
        (lambda s: s.update(schema_version=1), "unknown field `dispatch_journal_seq`"),
        (lambda s: s.update(dispatch_journal_seq=-1), "at `$.dispatch_journal_seq`"),
    ],
)
def test_each_version_is_held_to_its_own_fields(
    edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    state = msgspec.to_builtins(current())
    edit(state)
    with pytest.raises(
        SnapshotCorruptError,
        match=re.escape(message),
    ) as raised:
        decode(state)
    assert str(raised.value).startswith(f"snap/{CONTROLLER_STATE_FILENAME}: ")
