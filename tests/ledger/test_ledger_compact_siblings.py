"""The compact sibling of form 2 ledger segment records (read, no longer written; the writer
is ``tests/support/ledger_form2.py``): no empty fields, no derivable receipt fields, decoded
back to exactly the version 5 sibling."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from ledger_form2 import CompactAttempt, compact_sibling
from ledger_testkit import Harness

from rollvault.ledger.compact_siblings import (
    CompactAttemptState,
    CompactSiblingState,
    expand_siblings,
)
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.state_convert import group_to_state
from rollvault.ledger.state_schema import AttemptState


def _round_trip(record: PromptGroupRecoveryRecord) -> list[Any]:
    """The record's siblings as written (builtins), after checking they decode back exactly."""
    written = [msgspec.json.encode(compact_sibling(record.group_id, s)) for s in record.siblings]
    decoded = [msgspec.json.decode(data, type=CompactSiblingState) for data in written]
    expand_siblings(record.group_id, decoded)
    expected = msgspec.to_builtins(group_to_state(record).siblings)
    assert msgspec.to_builtins(decoded) == expected
    return [msgspec.json.decode(data) for data in written]


def test_a_sibling_is_stored_without_empty_or_derivable_fields(harness: Harness) -> None:
    group_id = harness.reserve(3)
    harness.dispatch(group_id)
    harness.seal(group_id, 0, keys=2)
    harness.fail(group_id, 1)
    sealed, failed, dispatched = _round_trip(harness.group(group_id))
    (attempt,) = sealed["attempts"]
    assert "gate_rollout_id" not in attempt["receipt"]
    assert "staging_keys" not in attempt["receipt"] and len(attempt["staging_keys"]) == 2
    assert set(failed["attempts"][0]) == {
        "attempt_uuid",
        "status",
        "failure_reason",
        "failure_kind",
    }
    assert [set(a) for a in dispatched["attempts"]] == [{"attempt_uuid", "status"}]


def test_a_receipt_whose_fields_are_not_the_derived_ones_keeps_them(harness: Harness) -> None:
    group_id = harness.reserve(1)
    harness.dispatch(group_id)
    harness.seal(group_id, 0)
    record = harness.group(group_id)  # a copy: the ledger is untouched
    receipt = record.siblings[0].attempts[-1].receipt
    assert receipt is not None
    receipt["gate_rollout_id"] = "not-derived"
    receipt["staging_keys"] = ["other"]
    (written,) = _round_trip(record)
    kept = written["attempts"][0]["receipt"]
    assert kept["gate_rollout_id"] == "not-derived" and kept["staging_keys"] == ["other"]


def _empty(field: msgspec.structs.FieldInfo) -> object:
    """The field's default in the compact form (the factory called)."""
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


@pytest.mark.parametrize("compact", [CompactAttempt, CompactAttemptState])
def test_the_compact_attempts_have_the_version_5_attempts_fields(compact: type) -> None:
    """A field added to ``AttemptState`` and forgotten in the compact form fails here."""
    attempt = msgspec.structs.fields(AttemptState)
    fields = msgspec.structs.fields(compact)
    assert [(f.name, f.encode_name, f.type) for f in fields] == [
        (f.name, f.encode_name, f.type) for f in attempt
    ]
    required = [f.name for f in fields if f.required]
    assert required == ["attempt_uuid", "status"]
    # Every other field defaults to its empty value, the value the writer leaves out.
    assert {f.name: _empty(f) for f in fields if not f.required} == {
        f.name: _empty_value_of(f.type) for f in attempt if f.name not in required
    }


def _empty_value_of(annotation: object) -> object:
    """``[]`` for a list, 0 for an int, None for an optional (``Annotated`` unwrapped)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is list:
        return []
    if annotation is int:
        return 0
    assert type(None) in typing.get_args(annotation), annotation
    return None


def test_only_the_written_form_omits_defaults() -> None:
    assert CompactAttempt.__struct_config__.omit_defaults
    assert not CompactAttemptState.__struct_config__.omit_defaults
    assert CompactAttemptState.__struct_config__.forbid_unknown_fields
