"""``bootstrap/dataset_identity.json``: the row digests a run started with, strict and checksummed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec
import pytest

import rollvault.durable.bootstrap as bootstrap
from rollvault.durable.bootstrap import ensure_bootstrap_anchor, holds_run
from rollvault.durable.compatibility import bootstrap_compatibility_identity
from rollvault.durable.dataset_identity import (
    DATASET_IDENTITY_SCHEMA_VERSION,
    DatasetIdentity,
    read_dataset_identity,
    write_dataset_identity,
)
from rollvault.durable.errors import IncompatibleRunError, SnapshotManifestError
from rollvault.durable.layout import BOOTSTRAP_MANIFEST_FILENAME, DATASET_IDENTITY_FILENAME


def _digests(*texts: str) -> list[str]:
    return [hashlib.sha256(text.encode()).hexdigest() for text in texts]


ROWS = _digests("a", "b", "c", "d")


def test_row_digests_round_trip_through_the_file(tmp_path: Path) -> None:
    identity = DatasetIdentity.of_rows(ROWS)
    assert identity.num_rows == 4 and identity.schema_version == DATASET_IDENTITY_SCHEMA_VERSION
    assert [identity.row_digest(i) for i in range(4)] == ROWS
    path = write_dataset_identity(tmp_path, identity)
    assert path == tmp_path / DATASET_IDENTITY_FILENAME
    assert read_dataset_identity(tmp_path) == identity
    with pytest.raises(IndexError):
        identity.row_digest(4)


def test_no_file_is_no_record(tmp_path: Path) -> None:
    assert read_dataset_identity(tmp_path) is None


def test_changed_rows_are_those_below_both_counts_that_differ() -> None:
    stored = DatasetIdentity.of_rows(ROWS)
    assert stored.changed_rows(DatasetIdentity.of_rows(ROWS)) == []
    edited = DatasetIdentity.of_rows([ROWS[0], *_digests("x"), ROWS[2], *_digests("y")])
    assert stored.changed_rows(edited) == [1, 3]
    assert stored.changed_rows(DatasetIdentity.of_rows([*ROWS, *_digests("e")])) == []
    assert stored.changed_rows(DatasetIdentity.of_rows(ROWS[1:])) == [0, 1, 2]
    assert DatasetIdentity.of_rows([]).changed_rows(stored) == []


@pytest.mark.parametrize("digest", ["zz" * 32, "ab" * 31, "ab" * 33])
def test_only_sha256_hex_digests_are_rows(digest: str) -> None:
    with pytest.raises(ValueError, match="SHA-256 hex digests"):
        DatasetIdentity.of_rows([ROWS[0], digest])


def _rewrite(tmp_path: Path, **changes: object) -> Path:
    write_dataset_identity(tmp_path, DatasetIdentity.of_rows(ROWS))
    path = tmp_path / DATASET_IDENTITY_FILENAME
    record = json.loads(path.read_text(encoding="utf-8"))
    record.update(changes)
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def test_another_schema_version_is_another_rollvault(tmp_path: Path) -> None:
    _rewrite(tmp_path, schema_version=DATASET_IDENTITY_SCHEMA_VERSION + 1, row_digests=[1])
    with pytest.raises(IncompatibleRunError) as info:
        read_dataset_identity(tmp_path)
    assert info.value.differences == [
        f"dataset identity schema version: {DATASET_IDENTITY_SCHEMA_VERSION + 1} -> "
        f"{DATASET_IDENTITY_SCHEMA_VERSION} (the anchor was written by another rollvault version)"
    ]


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"extra": 1}, r"invalid dataset identity: Object contains unknown field `extra`"),
        (
            {"num_rows": "4"},
            r"invalid dataset identity: Expected `int`, got `str` - at `\$.num_rows`",
        ),
        ({"num_rows": 5}, "corrupt: 128 digest bytes for 5 rows"),
        ({"checksum": "0" * 64}, "corrupt: its row digests fail their checksum"),
    ],
)
def test_a_malformed_or_damaged_record_names_the_file(
    tmp_path: Path, changes: dict[str, object], problem: str
) -> None:
    path = _rewrite(tmp_path, **changes)
    with pytest.raises(SnapshotManifestError, match=f"{path}: {problem}"):
        read_dataset_identity(tmp_path)


def test_a_file_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / DATASET_IDENTITY_FILENAME).write_bytes(b"{not json")
    with pytest.raises(SnapshotManifestError, match="invalid dataset identity"):
        read_dataset_identity(tmp_path)


def test_the_record_is_written_before_the_anchors_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = bootstrap_compatibility_identity({"seed": 0})
    real_write = bootstrap.atomic_write_bytes

    def crash_at_the_manifest(path: Path, data: bytes) -> None:
        if path.name == BOOTSTRAP_MANIFEST_FILENAME:
            raise KeyboardInterrupt("killed before the manifest")
        real_write(path, data)

    monkeypatch.setattr(bootstrap, "atomic_write_bytes", crash_at_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        ensure_bootstrap_anchor(
            tmp_path, identity=identity, dataset_identity=DatasetIdentity.of_rows(ROWS)
        )
    anchor = tmp_path / "bootstrap"
    assert (anchor / DATASET_IDENTITY_FILENAME).exists() and not holds_run(tmp_path)
    # The next start makes the anchor, with its own dataset's record.
    monkeypatch.setattr(bootstrap, "atomic_write_bytes", real_write)
    other = DatasetIdentity.of_rows(ROWS[:2])
    ensure_bootstrap_anchor(tmp_path, identity=identity, dataset_identity=other)
    assert holds_run(tmp_path) and read_dataset_identity(anchor) == other
    # An existing anchor's record is kept, whatever a later start passes.
    ensure_bootstrap_anchor(
        tmp_path, identity=identity, dataset_identity=DatasetIdentity.of_rows(ROWS)
    )
    assert read_dataset_identity(anchor) == other


def test_the_record_is_compact_json(tmp_path: Path) -> None:
    path = write_dataset_identity(
        tmp_path, DatasetIdentity.of_rows(_digests(*map(str, range(1000))))
    )
    raw = msgspec.json.decode(path.read_bytes())
    assert set(raw) == {"schema_version", "num_rows", "row_digests", "checksum"}
    assert isinstance(raw["row_digests"], str)  # base64 of the 32-byte digests
    assert path.stat().st_size < 44 * 1000 + 200
