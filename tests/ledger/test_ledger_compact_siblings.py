"""The compact sibling of form 2 ledger segment records: no empty fields, no derivable receipt
fields, decoded back to exactly the version 5 sibling."""

from __future__ import annotations

from typing import Any

import msgspec
from ledger_testkit import Harness

from rollvault.ledger.compact_siblings import (
    CompactSiblingState,
    compact_sibling,
    expand_siblings,
)
from rollvault.ledger.records import PromptGroupRecoveryRecord
from rollvault.ledger.state_convert import group_to_state


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
