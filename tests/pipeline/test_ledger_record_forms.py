"""The ledger segment's record forms (issue 16): form 4 (msgpack, packed pieces, deltas of a
sibling's changed attempts, status and header-field patches) round-trips any group exactly,
whole or as a delta; a seal costs a small record, a status change a few bytes; crafted form 3
and 4 records are refused with a named error; snapshots whose ledger is in form 2 segments
still restore, and their groups are written whole when they change; snapshots in form 3
segments restore and go on as form 4 deltas."""

from __future__ import annotations

import asyncio
import json
import re
import string
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_helpers import small_config
from snapshot_versions import ledger_segments_to_form_2, ledger_segments_to_form_3
from test_group_entries import _reserve
from test_incremental_snapshots import SIBLINGS, Run
from test_ledger_segments import (
    _downgraded,
    _ledger_files,
    _live_ledger,
    _records_in,
    _restored_ledger,
    _seal,
)

from rollvault.controller.snapshots import ledger_segments
from rollvault.controller.snapshots.ledger_segments import LedgerSegmentWriter
from rollvault.ledger.errors import LedgerStateError
from rollvault.ledger.ledger_records import (
    LEDGER_SEGMENT_SUFFIX,
    STATUS_CODE,
    STATUS_CODES,
    PackedRecordOut,
    SegmentRecords,
    decode_ledger_segment,
    encode_packed_record,
    encode_packed_segment,
    resolve_group,
)
from rollvault.ledger.packed_groups import PackedAttempt, PackedHeader, pack_attempt, pack_header
from rollvault.ledger.records import (
    PromptGroupRecoveryRecord,
    PromptRef,
    RolloutAttemptRecord,
    RolloutSiblingRecord,
)
from rollvault.ledger.reward_penalties import RewardChecks, RewardLogContext
from rollvault.ledger.state_convert import group_from_state, group_to_state
from rollvault.ledger.state_load import records_from_checked_state
from rollvault.ledger.state_schema import (
    ROLLOUT_RECOVERY_SCHEMA_VERSION,
    AttemptState,
    GroupHeaderState,
    LedgerState,
)
from rollvault.ledger.statuses import (
    AttemptFailureKind,
    PromptGroupPhase,
    PromptGroupStatus,
    RecoveryGranularity,
    RolloutAttemptStatus,
)

_UUID = uuid.UUID(int=1)

# -- random groups ---------------------------------------------------------------------------

_text = st.text(max_size=8)
_name = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
_floats = st.floats(allow_nan=False)  # NaN != NaN: equality could not say "the same"
# msgpack holds 64-bit ints (a receipt's are token counts and versions)
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), _floats, _text
)


@st.composite
def _staging_keys(draw: st.DrawFn, gate_id: str) -> list[str]:
    if draw(st.booleans()):  # the derived ones, as every gate writes them
        return [f"{gate_id}/{k}" for k in range(draw(st.integers(0, 3)))]
    return draw(st.lists(_text, max_size=3))


@st.composite
def _row_digest(draw: st.DrawFn) -> Any:
    digest = draw(
        st.one_of(
            st.binary(min_size=1, max_size=32).map(bytes.hex),  # what gates write
            _text,  # anything else, kept as it is
        )
    )
    row: dict[str, Any] = {"length": draw(st.integers(-2, 10_000)), "digest": digest}
    if draw(st.integers(0, 9)) == 0:
        row["extra"] = 1
    return row


@st.composite
def _receipt(draw: st.DrawFn, gate_id: str, keys: list[str]) -> dict[str, Any] | None:
    kind = draw(st.sampled_from(["none", "gate", "other"]))
    if kind == "none":
        return None
    if kind == "other":  # not a receipt the packed form holds: stored as its dict
        return draw(st.dictionaries(_text, _json_scalars, max_size=3))
    receipt: dict[str, Any] = {
        "gate_rollout_id": gate_id if draw(st.integers(0, 5)) else "other",
        "staging_keys": list(keys) if draw(st.integers(0, 5)) else ["x"],
    }
    optional = {
        "row_digests": st.lists(_row_digest(), max_size=2),
        "reward": st.one_of(_floats, st.integers(-3, 3)),
        "weight_version": st.integers(-1, 5),
        "worker_id": _text,
    }
    for field, values in optional.items():
        if draw(st.booleans()):
            receipt[field] = draw(
                st.one_of(st.none(), values) if field != "row_digests" else values
            )
    return receipt


@st.composite
def _attempt(draw: st.DrawFn, prefix: str) -> RolloutAttemptRecord:
    attempt_uuid = draw(st.uuids())
    gate_id = prefix + attempt_uuid.hex
    keys = draw(_staging_keys(gate_id))
    optional = st.one_of
    return RolloutAttemptRecord(
        attempt_uuid=attempt_uuid,
        status=draw(st.sampled_from(RolloutAttemptStatus)),
        receipt=draw(_receipt(gate_id, keys)),
        reward=draw(optional(st.none(), _floats)),
        mask_sample=draw(optional(st.none(), st.booleans())),
        reward_checks=draw(
            optional(
                st.none(),
                st.builds(
                    RewardChecks,
                    overlong=st.booleans(),
                    format_ok=st.booleans(),
                    finite_logprobs=st.booleans(),
                ),
            )
        ),
        reward_log_context=draw(
            optional(
                st.none(),
                st.builds(
                    RewardLogContext, response_length=st.integers(-1, 9999), stop_reason=_text
                ),
            )
        ),
        staging_keys=keys,
        failure_reason=draw(optional(st.none(), _text)),
        failure_kind=draw(optional(st.none(), st.sampled_from(AttemptFailureKind))),
        turn_keys=draw(st.lists(_text.filter(bool), max_size=2)),
        env_state_revision=draw(st.integers(0, 5)),
    )


@st.composite
def _group(draw: st.DrawFn) -> PromptGroupRecoveryRecord:
    group_id = draw(_name)
    siblings = [
        RolloutSiblingRecord(
            generation_index=index,
            attempts=draw(st.lists(_attempt(f"{group_id}_g{index}_a"), min_size=1, max_size=3)),
        )
        for index in range(draw(st.integers(1, 3)))
    ]
    return PromptGroupRecoveryRecord(
        group_id=group_id,
        admission_id=draw(_name),
        prompt_id=draw(_name),
        prompt_ref=PromptRef(sample_id=draw(_name), task_name=draw(st.one_of(st.none(), _text))),
        task_source=draw(st.one_of(st.none(), _text)),
        recovery_granularity=draw(st.sampled_from(RecoveryGranularity)),
        expected_generations=len(siblings),
        target_step=draw(st.one_of(st.none(), st.integers(0, 9))),
        start_weight_version=draw(st.integers(0, 9)),
        siblings=siblings,
        phase=draw(st.sampled_from(PromptGroupPhase)),
        status=draw(st.sampled_from(PromptGroupStatus)),
    )


@st.composite
def _changed(draw: st.DrawFn, before: PromptGroupRecoveryRecord) -> PromptGroupRecoveryRecord:
    """``before`` after some changes: attempts replaced, appended or dropped, a new header."""
    group_id = before.group_id
    siblings = []
    for sibling in before.siblings:
        attempts = list(sibling.attempts)
        prefix = f"{group_id}_g{sibling.generation_index}_a"
        action = draw(st.sampled_from(["keep", "replace_last", "append", "drop_last", "restatus"]))
        if action == "replace_last":
            attempts[-1] = draw(_attempt(prefix))
        elif action == "restatus":  # its status alone (form 4: a status patch)
            position = draw(st.integers(0, len(attempts) - 1))
            status = draw(st.sampled_from(RolloutAttemptStatus))
            attempts[position] = msgspec.structs.replace(attempts[position], status=status)
        elif action == "append":
            attempts += draw(st.lists(_attempt(prefix), min_size=1, max_size=2))
        elif action == "drop_last" and len(attempts) > 1:
            attempts.pop()
        siblings.append(
            RolloutSiblingRecord(generation_index=sibling.generation_index, attempts=attempts)
        )
    status = draw(st.sampled_from(PromptGroupStatus))
    phase = draw(st.sampled_from([before.phase, *PromptGroupPhase]))
    return msgspec.structs.replace(before, siblings=siblings, status=status, phase=phase)


def _read_back(directory: Path, pending: ledger_segments.PendingLedger) -> Any:
    """The newest group of ``pending``'s index, read back from the files on disk."""
    segments = {
        ref.file: decode_ledger_segment((directory / ref.file).read_bytes(), name=ref.file)
        for ref in pending.index.segments
    }
    ((position, ordinal),) = pending.index.groups
    link = (pending.index.segments[position].file, ordinal)
    return resolve_group(link, segments, set(), where="test")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_group_round_trips_exactly_whole_and_as_a_delta_on_its_previous_record(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    before = data.draw(_group())
    after = data.draw(_changed(before))
    directory = tmp_path_factory.mktemp("segments")
    writer = LedgerSegmentWriter(directory)
    with mock.patch.object(ledger_segments, "chain_budget", lambda group_id: 1e9):
        first = writer.write([before], stem="000001")
        writer.committed(first)
        second = writer.write([after], stem="000002")
    group, chain = _read_back(directory, first)
    assert msgspec.to_builtins(group) == msgspec.to_builtins(group_to_state(before))
    assert len(chain.links) == 1 and chain.deltable
    group, chain = _read_back(directory, second)
    assert msgspec.to_builtins(group) == msgspec.to_builtins(group_to_state(after))
    if second.info.new_records:  # a delta on the whole record
        assert second.info.delta_records == 1 and len(chain.links) == 2
        assert 0 < chain.delta_bytes < second.info.segment_bytes
    else:  # nothing changed: nothing written
        assert len(chain.links) == 1 and chain.delta_bytes == 0


# -- bytes -----------------------------------------------------------------------------------


def test_the_packed_pieces_have_the_version_5_fields() -> None:
    """A field added to the version 5 attempt or header and forgotten here fails."""
    packed = [f.name for f in msgspec.structs.fields(PackedAttempt)]
    assert sorted(packed) == sorted(AttemptState.__struct_fields__)
    assert PackedHeader.__struct_fields__ == GroupHeaderState.__struct_fields__
    # The empty fields come last, where the writer leaves them out: an unsealed attempt is
    # its UUID and status.
    dispatched = RolloutAttemptRecord(attempt_uuid=_UUID, status=RolloutAttemptStatus.DISPATCHED)
    assert msgspec.msgpack.decode(pack_attempt("g_g0_a", dispatched)) == [
        _UUID.bytes,
        "dispatched",
    ]


def test_a_seal_s_delta_record_holds_only_the_sealed_attempt(tmp_path: Path) -> None:
    """A seal costs ~100 bytes here (form 2: the whole sibling as JSON, ~500-900)."""
    config = small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")

    async def main() -> None:
        run = Run.fresh(config)
        parts = run.parts
        group = await _reserve(parts, sealed=1, gate=run.gate)
        files = _ledger_files(await run.snapshot())
        await _seal(parts, run.gate, group, 1)
        snapshot = await run.snapshot()
        (file,) = _ledger_files(snapshot) - files
        assert file.endswith(LEDGER_SEGMENT_SUFFIX)
        (record,) = _records_in(snapshot, file)
        base, header, ((index, start, (attempt,)),) = record
        assert base is not None and header is None and (index, start) == (1, 0)
        assert attempt[1] == "sealed" and len(attempt[0]) == 16  # its UUID's raw bytes
        data = (ledger_segments_dir(snapshot) / file).read_bytes()
        (raw,) = decode_ledger_segment(data, name=file).records
        assert len(raw) <= 140, len(raw)
        assert _restored_ledger(snapshot) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(main())


def ledger_segments_dir(snapshot: Path) -> Path:
    return snapshot.parent / "segments"


def test_a_dispatch_and_a_group_status_change_cost_status_and_field_patches(
    tmp_path: Path,
) -> None:
    """A cohort of dispatches rewrote each attempt (~30 bytes) and a group's status its
    header (~127): form 4 writes the new statuses (~4 bytes each) and the changed field."""
    before = msgspec.structs.replace(_group_record(16), group_id="g" * 36, admission_id="a" * 36)
    dispatched = [
        msgspec.structs.replace(
            sibling,
            attempts=[
                msgspec.structs.replace(a, status=RolloutAttemptStatus.DISPATCHED)
                for a in sibling.attempts
            ],
        )
        for sibling in before.siblings
    ]
    after = msgspec.structs.replace(
        before, siblings=dispatched, status=PromptGroupStatus.READY_TO_FINALIZE
    )
    writer = LedgerSegmentWriter(tmp_path)
    first = writer.write([before], stem="000001")
    writer.committed(first)
    second = writer.write([after], stem="000002")
    (file,) = {ref.file for ref in second.index.segments} - {
        ref.file for ref in first.index.segments
    }
    (record,) = decode_ledger_segment((tmp_path / file).read_bytes(), name=file).records
    base, header, siblings, statuses, fields = msgspec.msgpack.decode(record)
    assert base is not None and header is None and siblings == []
    assert statuses == [
        [index, 0, STATUS_CODE[RolloutAttemptStatus.DISPATCHED]] for index in range(16)
    ]
    status_field = PackedHeader.__struct_fields__.index("status")
    assert fields == {status_field: "ready_to_finalize"}
    assert len(record) <= 16 * 4 + 30, len(record)  # whole attempts and header: ~600 bytes
    group, chain = _read_back(tmp_path, second)
    assert msgspec.to_builtins(group) == msgspec.to_builtins(group_to_state(after))
    assert chain.delta_bytes == len(record)


# -- crafted records -------------------------------------------------------------------------


def _group_record(siblings: int = 2) -> PromptGroupRecoveryRecord:
    return PromptGroupRecoveryRecord(
        group_id="g",
        admission_id="a",
        prompt_id="p",
        prompt_ref=PromptRef(sample_id="p"),
        task_source=None,
        recovery_granularity=RecoveryGranularity.SIBLING,
        expected_generations=siblings,
        target_step=0,
        start_weight_version=0,
        siblings=[
            RolloutSiblingRecord(
                generation_index=index,
                attempts=[
                    RolloutAttemptRecord(
                        attempt_uuid=uuid.UUID(int=index + 1),
                        status=RolloutAttemptStatus.RESERVED,
                    )
                ],
            )
            for index in range(siblings)
        ],
        phase=PromptGroupPhase.ADMITTED,
        status=PromptGroupStatus.GENERATING,
    )


def _pieces(record: PromptGroupRecoveryRecord) -> tuple[msgspec.Raw, list[list[msgspec.Raw]]]:
    header = msgspec.Raw(pack_header(record))
    siblings = [
        [msgspec.Raw(pack_attempt(f"g_g{s.generation_index}_a", a)) for a in s.attempts]
        for s in record.siblings
    ]
    return header, siblings


def _resolve(
    records: list[PackedRecordOut | bytes],
    *,
    name: str = "s.ledger-segment.msgpack",
    others: dict[str, SegmentRecords] | None = None,
    bases: list[str] | None = None,
) -> Any:
    """Resolve the last of ``records``, one form 4 segment (its base list: ``bases``, by
    default itself)."""
    encoded = [r if isinstance(r, bytes) else encode_packed_record(r) for r in records]
    listed = [name] if bases is None else bases
    segment = decode_ledger_segment(encode_packed_segment(listed, encoded), name=name)
    segments = {name: segment, **(others or {})}
    return resolve_group((name, len(records) - 1), segments, set(), where="$.entry")


def _whole() -> PackedRecordOut:
    header, siblings = _pieces(_group_record())
    return PackedRecordOut(
        base=None, header=header, siblings=[(i, 0, attempts) for i, attempts in enumerate(siblings)]
    )


def test_a_well_formed_chain_resolves() -> None:
    header, siblings = _pieces(_group_record())
    delta = PackedRecordOut(base=(0, 0), header=None, siblings=[(1, 1, siblings[0])])
    group, chain = _resolve([_whole(), delta])
    assert [len(s.attempts) for s in group.siblings] == [1, 2]
    assert chain.delta_bytes == len(encode_packed_record(delta))


@pytest.mark.parametrize(
    ("crafted", "message"),
    [
        ("gap", "attempts in between are missing"),
        ("twice", "lists sibling 1 twice"),
        ("whole_from_1", "must hold the header and every sibling 0..n-1 from its first attempt"),
        ("whole_no_header", "must hold the header"),
        ("extra_sibling", "siblings [2] of a group of 2"),
        ("emptied", "siblings [1] have no attempt"),
        ("short_uuid", "Expected `bytes` of length >= 16"),
        ("unknown_status", "Invalid enum value 'lost'"),
        ("extra_field", "Expected `array` of at most length 12"),
        ("negative_start", "Expected `int` >= 0"),
        ("empty_group_id", "Expected `str` of length >= 1"),
    ],
)
def test_a_crafted_form_3_record_is_refused_naming_what_is_wrong(
    crafted: str, message: str
) -> None:
    record = _group_record()
    header, siblings = _pieces(record)
    whole = _whole()
    raw_attempt = siblings[0][0]
    bad: PackedRecordOut | bytes
    if crafted == "gap":
        bad = PackedRecordOut(base=(0, 0), header=None, siblings=[(1, 2, [raw_attempt])])
    elif crafted == "twice":
        bad = PackedRecordOut(
            base=(0, 0), header=None, siblings=[(1, 1, [raw_attempt]), (1, 1, [raw_attempt])]
        )
    elif crafted == "whole_from_1":
        bad = PackedRecordOut(
            base=None, header=header, siblings=[(0, 0, siblings[0]), (1, 1, siblings[1])]
        )
    elif crafted == "whole_no_header":
        bad = msgspec.structs.replace(whole, header=None)
    elif crafted == "extra_sibling":
        bad = PackedRecordOut(base=(0, 0), header=None, siblings=[(2, 0, [raw_attempt])])
    elif crafted == "emptied":
        bad = PackedRecordOut(base=(0, 0), header=None, siblings=[(1, 0, [])])
    else:
        attempt: list[Any] = [_UUID.bytes, "reserved"]
        fields: list[Any] = [None, header, [[0, 0, [attempt]], [1, 0, siblings[1]]]]
        if crafted == "short_uuid":
            attempt[0] = b"\x01" * 15
        elif crafted == "unknown_status":
            attempt[1] = "lost"
        elif crafted == "extra_field":
            attempt += [None, None, None, None, None, 0, None, None, [], 0, "more"]
        elif crafted == "negative_start":
            fields[2][0][1] = -1
        elif crafted == "empty_group_id":
            fields[1] = msgspec.msgpack.decode(header)
            fields[1][0] = ""
        bad = msgspec.msgpack.encode(fields)
        with pytest.raises(LedgerStateError, match=re.escape(message)) as refused:
            _resolve([bad])
        assert "ledger segment s.ledger-segment.msgpack record 0 ($.entry)" in str(refused.value)
        return
    with pytest.raises(LedgerStateError, match=re.escape(message)) as refused:
        _resolve([whole, bad])
    assert "$.entry" in str(refused.value)


def test_the_status_codes_are_the_format_s_and_cover_every_status() -> None:
    """The codes are written in form 4 records: never reordered, and a status added to the
    ledger needs its code (the writer looks every status up)."""
    assert [status.value for status in STATUS_CODES] == [
        "reserved",
        "dispatched",
        "sealed",
        "failed",
        "abandoned",
    ]
    assert set(STATUS_CODES) == set(RolloutAttemptStatus)


def _form_4_delta(**parts: Any) -> PackedRecordOut:
    return PackedRecordOut(**{"base": (0, 0), "header": None, "siblings": [], **parts})


def _field(name: str) -> int:
    return PackedHeader.__struct_fields__.index(name)


def test_a_form_4_delta_patches_statuses_and_header_fields_of_its_base() -> None:
    delta = _form_4_delta(
        statuses=[(1, 0, STATUS_CODE[RolloutAttemptStatus.DISPATCHED])],
        header_fields={_field("status"): msgspec.Raw(msgspec.msgpack.encode("finalizing"))},
    )
    group, chain = _resolve([_whole(), delta])
    expected = group_to_state(_group_record())
    expected.siblings[1].attempts[0].status = RolloutAttemptStatus.DISPATCHED
    expected.status = PromptGroupStatus.FINALIZING
    assert msgspec.to_builtins(group) == msgspec.to_builtins(expected)
    assert chain.delta_bytes == len(encode_packed_record(delta))


def test_a_form_4_delta_on_a_form_3_record_resolves_and_the_reverse_is_refused() -> None:
    old = "old.ledger-segment.msgpack"
    form_3 = decode_ledger_segment(
        encode_packed_segment([], [encode_packed_record(_whole())], form=3), name=old
    )
    assert form_3.form == 3
    delta = _form_4_delta(statuses=[(0, 0, STATUS_CODE[RolloutAttemptStatus.SEALED])])
    group, chain = _resolve([delta], others={old: form_3}, bases=[old])
    assert group.siblings[0].attempts[0].status == RolloutAttemptStatus.SEALED
    assert len(chain.links) == 2
    # A form 3 record is never a delta on a form 4 one (no form 3 writer saw form 4).
    new = "new.ledger-segment.msgpack"
    form_4 = decode_ledger_segment(
        encode_packed_segment([], [encode_packed_record(_whole())]), name=new
    )
    on_4 = encode_packed_segment([new], [encode_packed_record(_form_4_delta())], form=3)
    with pytest.raises(LedgerStateError, match="a form 4 record, from a form 3 one"):
        resolve_group(
            (old, 0),
            {old: decode_ledger_segment(on_4, name=old), new: form_4},
            set(),
            where="$.entry",
        )


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"statuses": [(1, 1, 1)]}, "sibling 1's attempt 1, which its base does not hold"),
        (
            {"siblings": [(1, 0, "attempt")], "statuses": [(1, 0, 1)]},
            "sibling 1's attempt 0, which its base does not hold",
        ),
        ({"statuses": [(0, 0, 1), (0, 0, 2)]}, "patches sibling 0's attempt 0 twice"),
        ({"statuses": [(2, 0, 1)]}, "siblings [2] of a group of 2"),
        ({"statuses": [(0, 0, 5)]}, "Expected `int` <= 4"),
        ({"header": "header", "header_fields": {10: "failed"}}, "both a header and header"),
        ({"header_fields": {11: "failed"}}, "Expected `int` <= 10"),
        ({"header_fields": {10: "lost"}}, "its header fields give Invalid enum value 'lost'"),
        ({"header_fields": {6: 0}}, "its header fields give Expected `int` >= 1"),
        ({"header_fields": {}}, "Expected `object` of length >= 1"),
        ({"base": None, "header": "header", "statuses": [(0, 0, 1)]}, "and no patch"),
    ],
)
def test_a_crafted_form_4_record_is_refused_naming_what_is_wrong(
    parts: dict[str, Any], message: str
) -> None:
    header, siblings = _pieces(_group_record())
    raw = {"header": header, "attempt": siblings[0][0]}
    fields: dict[str, Any] = {"base": (0, 0), "header": None, "siblings": []}
    for name, value in parts.items():
        if name == "header":
            fields[name] = raw[value]
        elif name == "siblings":
            fields[name] = [(i, start, [raw[a]]) for i, start, a in value]
        elif name == "header_fields":
            fields[name] = {k: msgspec.Raw(msgspec.msgpack.encode(v)) for k, v in value.items()}
        else:
            fields[name] = value
    if fields["base"] is None:
        fields["siblings"] = [(i, 0, attempts) for i, attempts in enumerate(siblings)]
    # Encoded as written, the checks of encode_packed_record's types aside.
    record = msgspec.msgpack.encode(
        [fields["base"], fields["header"], fields["siblings"]]
        + [fields.get("statuses", []), fields.get("header_fields")]
    )
    with pytest.raises(LedgerStateError, match=re.escape(message)) as refused:
        _resolve([_whole(), record])
    assert "$.entry" in str(refused.value)


def test_a_form_3_segment_refuses_the_form_4_parts() -> None:
    record = encode_packed_record(_form_4_delta(statuses=[(0, 0, 1)]))
    name = "s.ledger-segment.msgpack"
    data = encode_packed_segment([name], [encode_packed_record(_whole()), record], form=3)
    segment = decode_ledger_segment(data, name=name)
    with pytest.raises(LedgerStateError, match="Expected `array` of at most length 3"):
        resolve_group((name, 1), {name: segment}, set(), where="$.entry")


def test_a_form_3_chain_reaching_a_json_segment_is_refused() -> None:
    form_2 = decode_ledger_segment(
        json.dumps(
            {"ledger_segment_format": 2, "bases": [], "records": [[None, None, []]]}
        ).encode(),
        name="old.ledger-segment.json",
    )
    delta = PackedRecordOut(base=(0, 0), header=None, siblings=[])
    encoded = encode_packed_segment(["old.ledger-segment.json"], [encode_packed_record(delta)])
    segment = decode_ledger_segment(encoded, name="s.ledger-segment.msgpack")
    with pytest.raises(LedgerStateError, match="a form 2 record, from a form 4 one"):
        resolve_group(
            ("s.ledger-segment.msgpack", 0),
            {"s.ledger-segment.msgpack": segment, "old.ledger-segment.json": form_2},
            set(),
            where="$.entry",
        )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (msgspec.msgpack.encode([2, [], []]), "a msgpack segment is form 3 or 4"),
        (msgspec.msgpack.encode([5, [], []]), "a msgpack segment is form 3 or 4"),
        (msgspec.msgpack.encode({"ledger_segment_format": 3}), "Expected `array`, got `object`"),
        (b'{"ledger_segment_format": 3, "bases": [], "records": []}', "got `int`"),
        (msgspec.msgpack.encode([3, ["../x.ledger-segment.msgpack"], []]), "matching regex"),
    ],
)
def test_a_form_3_segment_of_another_shape_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(LedgerStateError, match=message) as refused:
        decode_ledger_segment(data, name="s.ledger-segment.msgpack")
    assert "ledger segment s.ledger-segment.msgpack" in str(refused.value)


def test_a_json_segment_claiming_form_3_is_refused() -> None:
    data = b'{"ledger_segment_format": 3, "bases": [], "records": []}'
    with pytest.raises(
        LedgerStateError, match=r"forms 3 and 4 are msgpack, \*.ledger-segment.msgpack"
    ):
        decode_ledger_segment(data, name="s.ledger-segment.json")


# -- form 2 snapshots ------------------------------------------------------------------------


def test_a_snapshot_of_form_2_ledger_segments_restores_and_its_groups_change_whole_first(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")

    async def write() -> tuple[str, str, dict[str, Any]]:
        run = Run.fresh(config)
        flying = await _reserve(run.parts, sealed=1, gate=run.gate)
        await _reserve(run.parts, sealed=SIBLINGS, gate=run.gate)
        waiting = await _reserve(run.parts, sealed=SIBLINGS - 1, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return flying, waiting, _restored_ledger(newest)

    flying, waiting, expected = asyncio.run(write())
    # As the writer before form 3 (a form 2 delta included).
    source, form_2 = _downgraded(config, ledger_segments_to_form_2, expected)

    async def restart() -> None:
        run = await Run.restored(config, source)
        parts = run.parts
        after = await run.snapshot()
        (file,) = _ledger_files(after) - {form_2}
        assert file.endswith(LEDGER_SEGMENT_SUFFIX)
        records = _records_in(after, file)
        # the restart interrupted both groups' dispatched attempts: each rewritten, whole
        assert len(records) == 2 and all(record[0] is None for record in records)
        assert _restored_ledger(after) == _live_ledger(parts)
        async with parts.cut.mutation():  # its interrupted sibling's fresh attempt
            parts.ledger.mark_group_dispatched(parts.cut, waiting)
        await _seal(parts, run.gate, waiting, SIBLINGS - 1)  # now a form 3 delta on it
        newest = await run.snapshot()
        # (the form 2 segment, 1 of its 4 records live now, is compacted into a cold one)
        (changed,) = [f for f in _ledger_files(newest) - _ledger_files(after) if "-cold" not in f]
        (delta,) = _records_in(newest, changed)
        assert delta[0] is not None
        assert _restored_ledger(newest) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(restart())
    assert flying != waiting


def test_a_snapshot_of_form_3_ledger_segments_restores_and_goes_on_as_form_4_deltas(
    tmp_path: Path,
) -> None:
    """What main wrote before form 4: its chains are deltable, so a restored writer writes
    its groups' changes as form 4 deltas on the form 3 records (status patches included)."""
    config = small_config(tmp_path, "rollout_checkpointing.keep_latest_k=2")

    async def write() -> tuple[str, dict[str, Any]]:
        run = Run.fresh(config)
        await _reserve(run.parts, sealed=1, gate=run.gate)
        waiting = await _reserve(run.parts, sealed=SIBLINGS - 1, gate=run.gate)
        newest = await run.snapshot()
        run.parts.logs.close()
        return waiting, _restored_ledger(newest)

    waiting, expected = asyncio.run(write())
    # As the writer before form 4 (a form 3 delta included).
    source, form_3 = _downgraded(config, ledger_segments_to_form_3, expected)

    async def restart() -> None:
        run = await Run.restored(config, source)
        parts = run.parts
        after = await run.snapshot()
        (file,) = _ledger_files(after) - {form_3}
        # the restart interrupted both groups' dispatched attempts: deltas on form 3 records
        records = _records_in(after, file)
        assert len(records) == 2 and all(record[0] is not None for record in records)
        assert _restored_ledger(after) == _live_ledger(parts)
        async with parts.cut.mutation():  # its interrupted sibling's fresh attempt
            parts.ledger.mark_group_dispatched(parts.cut, waiting)
        newest = await run.snapshot()
        (changed,) = [f for f in _ledger_files(newest) - _ledger_files(after) if "-cold" not in f]
        (delta,) = _records_in(newest, changed)
        # reserved -> dispatched: a status patch, no attempt written again
        assert delta[0] is not None and delta[2] == [] and len(delta[3]) == 1
        assert _restored_ledger(newest) == _live_ledger(parts)
        parts.logs.close()

    asyncio.run(restart())


@given(groups=st.lists(_group(), max_size=4))
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_a_checked_state_loads_into_the_records_one_at_a_time_conversion_builds(
    groups: list[PromptGroupRecoveryRecord],
) -> None:
    """``records_from_checked_state`` (one conversion of the whole ledger) builds exactly the
    records that ``group_from_state`` builds group by group, and none of them shares a
    container with the persisted state (a restore keeps that state beside the ledger)."""
    unique = list({group.group_id: group for group in groups}.values())
    state = LedgerState(
        schema_version=ROLLOUT_RECOVERY_SCHEMA_VERSION,
        groups=[group_to_state(group) for group in unique],
    )
    state = msgspec.convert(msgspec.to_builtins(state), LedgerState)  # its own containers
    loaded = records_from_checked_state(state)
    one_by_one = {
        group.group_id: group_from_state(
            group,
            {
                attempt.attempt_uuid: uuid.UUID(hex=attempt.attempt_uuid)
                for sibling in group.siblings
                for attempt in sibling.attempts
            },
        )
        for group in state.groups
    }
    assert list(loaded) == list(one_by_one)
    assert loaded == one_by_one
    assert list(loaded.values()) == [
        msgspec.structs.replace(group, runtime_prompt_payload=None) for group in unique
    ]
    for persisted in state.groups:
        for sibling in persisted.siblings:
            for attempt in sibling.attempts:
                _forge_containers(attempt)
    assert (
        loaded
        == one_by_one
        == {
            group.group_id: msgspec.structs.replace(group, runtime_prompt_payload=None)
            for group in unique
        }
    )


def _forge_containers(attempt: AttemptState | RolloutAttemptRecord) -> None:
    """Change every container of ``attempt`` in place: a form that shares one shows it."""
    attempt.staging_keys.append("forged")
    attempt.turn_keys.append("forged")
    if attempt.receipt is not None:
        attempt.receipt["forged"] = True
        for value in attempt.receipt.values():
            if isinstance(value, list):
                value.append("forged")
