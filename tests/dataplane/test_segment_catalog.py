"""Version 4 and 5 data-plane indexes: the row segments' fixed parts in per-anchor catalogs
(version 5: the segments whose rows are all held as runs of numbers)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from data_plane_v2 import index_as_version_4
from dataplane_helpers import assert_rows_identical, sample_row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollvault.cut import DataPlaneMutationCut
from rollvault.dataplane import (
    METADATA_FILENAME,
    STAGING_PARTITION,
    TRAIN_PARTITION,
    DataPlaneCheckpointError,
    EmbeddedDataPlane,
    Row,
)
from rollvault.dataplane import segment_catalog as catalog_module
from rollvault.dataplane.checkpoint_format import decode_envelope, encode_envelope
from rollvault.dataplane.segment_catalog import (
    MAX_CATALOGS,
    WrittenCatalog,
    catalogs_to_merge,
    plan_catalogs,
)
from rollvault.dataplane.segmented import read_segmented
from rollvault.dataplane.segmented_index import (
    checkpoint_summary,
    read_segmented_content,
    referenced_segments,
)
from rollvault.dataplane.segmented_writer import SegmentedWriteInfo, SegmentedWriter

USER: dict[str, Any] = {"sidecars": {}}


def write(writer: SegmentedWriter, plane: EmbeddedDataPlane, directory: Path, stem: str) -> Any:
    pending = writer.write(directory, plane.capture(), USER, stem=stem)
    writer.committed(pending)
    return pending.info


def read_back(directory: Path, segments: Path) -> dict[str, dict[str, Any]]:
    loaded = read_segmented(directory, segments).checkpoint
    assert loaded.user_metadata == USER
    return {partition: dict(rows) for partition, rows in loaded.partitions.items()}


def assert_same(got: dict[str, dict[str, Any]], expected: dict[str, dict[str, Row]]) -> None:
    assert {p: sorted(rows) for p, rows in got.items() if rows} == {
        p: sorted(rows) for p, rows in expected.items() if rows
    }
    for partition, rows in expected.items():
        for key, row in rows.items():
            assert_rows_identical(dict(got[partition][key]), row)


def content_of(snapshot: Path) -> Any:
    path = snapshot / METADATA_FILENAME
    version, content_bytes = decode_envelope(path.read_bytes(), path)
    assert version in (4, 5)
    return json.loads(content_bytes)


def rewrite_content(snapshot: Path, change: Any) -> Path:
    path = snapshot / METADATA_FILENAME
    version, content_bytes = decode_envelope(path.read_bytes(), path)
    content = json.loads(content_bytes)
    change(content)
    path.write_bytes(encode_envelope(json.dumps(content).encode(), version))
    return path


# -- which catalogs merge ---------------------------------------------------------------


def test_merges_keep_at_most_the_limit_the_fewest_live_first() -> None:
    live = {"c1": 5, "c2": 1, "c3": 0, "c4": 3, "c5": 1}
    # c3 holds no live entry: dropped, not merged. Four left + the new one, limit 3: two go.
    assert catalogs_to_merge(live, adding=True, limit=3) == ["c2", "c5"]
    assert catalogs_to_merge(live, adding=True, limit=5) == []
    # No new catalog otherwise: merging writes one, so one more goes.
    assert catalogs_to_merge(live, adding=False, limit=4) == []
    assert catalogs_to_merge(live, adding=False, limit=3) == ["c2", "c5"]
    assert catalogs_to_merge(live, adding=False, limit=1) == ["c2", "c5", "c4", "c1"]
    assert catalogs_to_merge({}, adding=True, limit=1) == []


def _catalog(file: str, *segments: str) -> WrittenCatalog:
    return WrittenCatalog(file=file, sha256="0" * 64, byte_size=1, segments=segments)


def test_a_plan_keeps_the_catalogs_of_held_segments_and_describes_the_new_ones() -> None:
    listed = {"a": _catalog("a", "s1", "s2"), "b": _catalog("b", "s3"), "c": _catalog("c", "s4")}
    plan = plan_catalogs(listed, ["s5", "s1", "s4", "s0"], limit=4)
    assert plan.kept == {"a": listed["a"], "c": listed["c"]}  # b: none of it held
    assert plan.moving == ["s0", "s5"]  # sorted
    nothing_new = plan_catalogs(listed, ["s3", "s2"], limit=4)
    assert nothing_new.kept == {"a": listed["a"], "b": listed["b"]}
    assert nothing_new.moving == []  # no new catalog


def test_a_plan_at_the_limit_moves_the_fewest_live_catalogs_entries() -> None:
    listed = {"a": _catalog("a", "s1", "s2"), "b": _catalog("b", "s3"), "c": _catalog("c", "s4")}
    held = ["s1", "s2", "s3", "s4"]
    plan = plan_catalogs(listed, [*held, "s5"], limit=3)
    assert plan.kept == {"a": listed["a"], "c": listed["c"]}  # b has the fewest (tie: name)
    assert plan.moving == ["s3", "s5"]
    # With nothing new, a merge still writes a catalog: one more goes.
    merged = plan_catalogs(listed, held, limit=2)
    assert merged.kept == {"a": listed["a"]}
    assert merged.moving == ["s3", "s4"]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), max_size=8),
    data=st.data(),
    new=st.integers(0, 3),
    limit=st.integers(1, 6),
)
def test_a_plan_describes_every_held_segment_once_within_the_limit(
    sizes: list[int], data: st.DataObject, new: int, limit: int
) -> None:
    listed: dict[str, WrittenCatalog] = {}
    segments: list[str] = []
    for number, size in enumerate(sizes):
        files = tuple(f"s{number}_{k}" for k in range(size))
        listed[f"c{number}"] = _catalog(f"c{number}", *files)
        segments += files
    held = data.draw(st.lists(st.sampled_from(segments), unique=True)) if segments else []
    held += [f"new{k}" for k in range(new)]
    plan = plan_catalogs(listed, held, limit=limit)
    described = [s for catalog in plan.kept.values() for s in catalog.segments if s in held]
    assert sorted(described + plan.moving) == sorted(held)  # each held segment exactly once
    assert plan.moving == sorted(plan.moving) and set(plan.moving) <= set(held)
    assert all(set(c.segments) & set(held) for c in plan.kept.values())  # none kept for nothing
    assert set(plan.kept) <= set(listed)
    assert len(plan.kept) + (1 if plan.moving else 0) <= limit


# -- the writer over many snapshots -----------------------------------------------------


def run_rounds(tmp_path: Path, rounds: int, seed: int, limit: int) -> list[SegmentedWriteInfo]:
    """``rounds`` snapshots of a store whose rows come and go at random; each snapshot read
    back whole and checked against the store. Returns each write's info."""
    rng = random.Random(seed)
    segments = tmp_path / "segments"
    plane = EmbeddedDataPlane(DataPlaneMutationCut())
    writer = SegmentedWriter(segments)
    expected: dict[str, dict[str, Row]] = {STAGING_PARTITION: {}, TRAIN_PARTITION: {}}
    infos = []
    next_key = 0

    async def step() -> None:
        nonlocal next_key
        for partition in (STAGING_PARTITION, TRAIN_PARTITION):
            held = expected[partition]
            gone = [key for key in sorted(held) if rng.random() < 0.25]
            if gone:
                await plane.clear(partition, gone)
                for key in gone:
                    del held[key]
            new = {f"k{next_key + n}": sample_row(next_key + n, length=2) for n in range(3)}
            next_key += 3
            if rng.random() < 0.8:
                await plane.put(partition, new)
                held.update(new)

    # The snapshot before, with what it held: it must still read back (retention keeps 2).
    previous: tuple[Path, dict[str, dict[str, Row]]] | None = None
    for number in range(1, rounds + 1):
        asyncio.run(step())
        directory = tmp_path / f"s{number}"
        info = write(writer, plane, directory, f"{number:06d}")
        infos.append(info)
        assert len(info.catalogs) <= limit
        assert_same(read_back(directory, segments), expected)
        summary = checkpoint_summary(directory, segments)
        assert {path.name for path, _size in summary.files} == {*info.referenced, *info.catalogs}
        assert referenced_segments([directory]) == {*info.referenced, *info.catalogs}
        # Every held segment is described by exactly one listed catalog.
        index = read_segmented_content(directory, segments)
        described = [file for catalog in index.catalogs for file in catalog.segments]
        assert set(info.referenced) <= set(described)
        if previous is not None:
            assert_same(read_back(previous[0], segments), previous[1])
        previous = directory, {p: dict(r) for p, r in expected.items()}
    return infos


@pytest.mark.parametrize("limit", [1, 3, MAX_CATALOGS])
def test_many_snapshots_read_back_and_list_at_most_the_limit(
    tmp_path: Path, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_module, "MAX_CATALOGS", limit)
    infos = run_rounds(tmp_path, 40, seed=limit, limit=limit)
    most = max(len(info.catalogs) for info in infos)
    if limit < MAX_CATALOGS:  # reached, so merges happened (rows die too slowly to avoid it)
        assert most == limit
    assert any(info.catalog_bytes for info in infos[1:])


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16), limit=st.integers(1, 6))
def test_random_histories_read_back_exactly(tmp_path_factory: Any, seed: int, limit: int) -> None:
    tmp_path = tmp_path_factory.mktemp("history")
    catalog_module.MAX_CATALOGS = limit  # type: ignore[misc]
    try:
        run_rounds(tmp_path, 12, seed=seed, limit=limit)
    finally:
        catalog_module.MAX_CATALOGS = MAX_CATALOGS  # type: ignore[misc]


def test_the_index_no_longer_grows_by_a_digest_per_segment(tmp_path: Path) -> None:
    """Sixty snapshots each adding a segment that stays held: version 3 would list 60 rows
    of ~70 bytes; version 4 lists at most MAX_CATALOGS catalogs and ~11 bytes a segment,
    version 5 one run for the 60, and no snapshot rewrites more than its share of the
    catalog entries."""
    segments = tmp_path / "segments"
    plane = EmbeddedDataPlane(DataPlaneMutationCut())
    writer = SegmentedWriter(segments)
    catalog_bytes = []
    for number in range(1, 61):
        asyncio.run(plane.put(STAGING_PARTITION, {f"r{number}": sample_row(number, length=1)}))
        info = write(writer, plane, tmp_path / f"s{number}", f"{number:06d}")
        catalog_bytes.append(info.catalog_bytes)
    content = content_of(tmp_path / "s60")
    staging = content["partitions"].index(STAGING_PARTITION)
    assert (content["whole"], content["segments"]) == ([[staging, 1, 60]], [])
    assert len(content["catalogs"]) <= MAX_CATALOGS
    index_as_version_4(tmp_path / "s60", segments)  # as main wrote it: an entry a segment
    content = content_of(tmp_path / "s60")
    assert len(content["segments"]) == 60
    for entry in content["segments"]:
        assert len(json.dumps(entry, separators=(",", ":"))) <= 12
    # A new segment's entry is ~90 bytes; a merge moves at most the average catalog's
    # live entries (60 / 17 < 4): never the whole catalog at once.
    assert max(catalog_bytes) < 6 * 100
    index = read_segmented_content(tmp_path / "s60", segments)
    assert sorted(file for c in index.catalogs for file in c.segments) == sorted(
        held.file for held in index.segments
    )


# -- refusals ---------------------------------------------------------------------------


@pytest.fixture
def snapshot(written: tuple[Path, Path]) -> tuple[Path, Path]:
    """:func:`written`'s snapshots, the second's index rewritten as version 4 (as main wrote
    it: an entry per held segment), which is still read; returns (segments, second)."""
    segments, second = written
    index_as_version_4(second, segments)
    return segments, second


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, Path]:
    """Two snapshots, the second holding rows of segments 1 and 2 (two catalogs);
    returns (segments, second)."""
    segments = tmp_path / "segments"
    plane = EmbeddedDataPlane(DataPlaneMutationCut())
    writer = SegmentedWriter(segments)
    asyncio.run(plane.put(STAGING_PARTITION, {"a": sample_row(1), "b": sample_row(2)}))
    write(writer, plane, tmp_path / "s1", "000001")
    asyncio.run(plane.put(TRAIN_PARTITION, {"t": sample_row(3)}))
    info = write(writer, plane, tmp_path / "s2", "000002")
    assert info.catalogs == ("000001-rows.catalog.json", "000002-rows.catalog.json")
    return segments, tmp_path / "s2"


def refused(snapshot: Path, segments: Path, culprit: Path, message: str) -> None:
    with pytest.raises(DataPlaneCheckpointError, match=message) as caught:
        read_segmented(snapshot, segments)
    assert caught.value.path == culprit
    with pytest.raises(DataPlaneCheckpointError, match=message):
        checkpoint_summary(snapshot, segments)


def test_the_written_form(written: tuple[Path, Path]) -> None:
    segments, second = written
    content = content_of(second)
    catalog = segments / "000001-rows.catalog.json"
    data = catalog.read_bytes()
    assert content["catalogs"][0] == [
        1,
        base64.b64encode(hashlib.sha256(data).digest()).decode(),
        len(data),
        1,
    ]
    staging = content["partitions"].index(STAGING_PARTITION)
    train = content["partitions"].index(TRAIN_PARTITION)
    # Both segments hold every row: runs of one, nothing listed one by one.
    assert sorted(content["whole"]) == [[staging, 1, 1], [train, 2, 1]]
    assert content["segments"] == []
    segment = segments / "000001-rollout_staging.segment.safetensors"
    digest = hashlib.sha256(segment.read_bytes()).digest()
    assert json.loads(data) == {
        "schema_version": 1,
        "entries": [
            [1, STAGING_PARTITION, base64.b64encode(digest).decode(), segment.stat().st_size, 2]
        ],
    }


def test_a_missing_catalog_is_named(snapshot: tuple[Path, Path]) -> None:
    segments, second = snapshot
    catalog = segments / "000001-rows.catalog.json"
    catalog.unlink()
    refused(second, segments, catalog, "missing catalog")


@pytest.mark.parametrize("damage", ["flip", "truncate", "append"])
def test_a_damaged_catalog_is_named(snapshot: tuple[Path, Path], damage: str) -> None:
    segments, second = snapshot
    catalog = segments / "000002-rows.catalog.json"
    data = bytearray(catalog.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        message = "catalog checksum mismatch"
    elif damage == "truncate":
        del data[-3:]
        message = "catalog size is"
    else:
        data += b" "
        message = "catalog size is"
    catalog.write_bytes(bytes(data))
    refused(second, segments, catalog, message)


def forge_catalog(segments: Path, second: Path, content: Any, *, entry_count: int = 1) -> Path:
    """Replace the second catalog by ``content`` (JSON) and record its digest and size in
    the index, so that only the content's own check can refuse it."""
    catalog = segments / "000002-rows.catalog.json"
    data = json.dumps(content).encode()
    catalog.write_bytes(data)

    def record(index: dict[str, Any]) -> None:
        index["catalogs"][1] = [
            2,
            base64.b64encode(hashlib.sha256(data).digest()).decode(),
            len(data),
            entry_count,
        ]

    rewrite_content(second, record)
    return catalog


def catalog_content(segments: Path) -> Any:
    return json.loads((segments / "000002-rows.catalog.json").read_bytes())


def _entry_set(position: int, value: Any) -> Any:
    def change(content: dict[str, Any]) -> None:
        content["entries"][0][position] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(schema_version=2), "unsupported catalog schema_version 2"),
        (lambda c: c.update(extra=1), "Object contains unknown field `extra`"),
        (_entry_set(1, "no/such"), r"at `\$.entries\[0\]\[1\]`"),
        (_entry_set(2, "AAAA"), r"Expected `bytes` of length >= 32 - at `\$.entries\[0\]\[2\]`"),
        (_entry_set(3, -1), r"Expected `int` >= 0 - at `\$.entries\[0\]\[3\]`"),
        (_entry_set(0, "../x.segment.safetensors"), r"at `\$.entries\[0\]\[0\]`"),
        (lambda c: c["entries"][0].pop(), r"at `\$.entries\[0\]`"),
        (
            lambda c: c["entries"].append(list(c["entries"][0])),
            r"\$.entries\[1\]\[0\] \(name\): segment '000002-train.segment.safetensors' "
            r"described twice",
        ),
    ],
)
def test_a_malformed_catalog_is_refused_naming_it_and_the_field(
    snapshot: tuple[Path, Path], change: Any, message: str
) -> None:
    segments, second = snapshot
    content = catalog_content(segments)
    change(content)
    count = len(content.get("entries", []))
    catalog = forge_catalog(segments, second, content, entry_count=count)
    refused(second, segments, catalog, message)


def test_a_catalog_of_another_entry_count_is_refused(snapshot: tuple[Path, Path]) -> None:
    segments, second = snapshot
    catalog = forge_catalog(segments, second, catalog_content(segments), entry_count=2)
    refused(second, segments, catalog, "catalog holds 1 entries, the snapshot records 2")


def test_a_segment_two_catalogs_describe_is_refused(snapshot: tuple[Path, Path]) -> None:
    segments, second = snapshot
    first = json.loads((segments / "000001-rows.catalog.json").read_bytes())
    content = catalog_content(segments)
    content["entries"].append(first["entries"][0])
    catalog = forge_catalog(segments, second, content, entry_count=2)
    refused(
        second,
        segments,
        catalog,
        "segment '000001-rollout_staging.segment.safetensors' is also described by catalog "
        "'000001-rows.catalog.json'",
    )


def test_a_segment_no_catalog_describes_is_refused(snapshot: tuple[Path, Path]) -> None:
    segments, second = snapshot
    path = rewrite_content(second, lambda c: c["catalogs"].pop())
    refused(
        second,
        segments,
        path,
        r"segments\[1\]\[0\] \(name\): segment '000002-train.segment.safetensors' is "
        "described by none of its catalogs",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c["catalogs"].append(list(c["catalogs"][0])),
            r"catalogs\[2\]\[0\] \(name\): '000001-rows.catalog.json' listed twice",
        ),
        (lambda c: c["catalogs"][0].__setitem__(0, "../x.catalog.json"), r"catalogs\[0\]\[0\]"),
        (lambda c: c["catalogs"][0].__setitem__(3, -1), r"catalogs\[0\]\[3\]"),
        (lambda c: c["segments"][0].__setitem__(1, 5), r"segments\[0\]\[1\] \(partition\): 5"),
        (
            lambda c: c["segments"][0].__setitem__(2, [1, 2]),
            r"segments\[0\]\[2\] \(live\): runs add up to 3 rows, the segment has 2",
        ),
        (lambda c: c["segments"][0].append(1), r"at most length 3"),
    ],
)
def test_a_malformed_index_row_is_refused_naming_the_field(
    snapshot: tuple[Path, Path], change: Any, message: str
) -> None:
    segments, second = snapshot
    path = rewrite_content(second, change)
    refused(second, segments, path, message)


def test_a_segment_the_index_places_in_another_partition_is_described_by_none(
    snapshot: tuple[Path, Path],
) -> None:
    """Index rows and catalog entries match on (name, partition): the train segment listed
    under the staging partition is another file, which no catalog describes."""
    segments, second = snapshot
    staging = content_of(second)["partitions"].index(STAGING_PARTITION)
    path = rewrite_content(second, lambda c: c["segments"][1].__setitem__(1, staging))
    refused(
        second,
        segments,
        path,
        r"segments\[1\]\[0\] \(name\): segment '000002-rollout_staging.segment.safetensors' "
        "is described by none",
    )


def test_a_name_given_as_text_where_its_number_is_due_is_refused(
    snapshot: tuple[Path, Path],
) -> None:
    """One spelling per file, so that index rows and catalog entries match without building
    file names; the other spelling is refused, in the catalog and in the index."""
    segments, second = snapshot
    original = catalog_content(segments)
    content = catalog_content(segments)
    content["entries"][0][0] = "000002-train.segment.safetensors"
    catalog = forge_catalog(segments, second, content)
    refused(second, segments, catalog, r"\$.entries\[0\]\[0\] \(name\): the text")
    forge_catalog(segments, second, original)
    read_segmented(second, segments)  # as written again: readable
    path = rewrite_content(
        second, lambda c: c["segments"][1].__setitem__(0, "000002-train.segment.safetensors")
    )
    refused(second, segments, path, r"\$.content.segments\[1\]\[0\] \(name\): the text")


def test_a_version_4_index_without_its_segments_directory_is_refused(
    snapshot: tuple[Path, Path],
) -> None:
    _segments, second = snapshot
    with pytest.raises(DataPlaneCheckpointError, match="read it with its segments directory"):
        read_segmented_content(second)


def test_an_entry_is_msgspec_strict(snapshot: tuple[Path, Path]) -> None:
    """A catalog is never executed: a pickle-like payload is just a schema error."""
    segments, second = snapshot
    content = {"schema_version": 1, "entries": [{"__reduce__": "os.system"}]}
    catalog = forge_catalog(segments, second, content)
    refused(second, segments, catalog, "invalid catalog")
    assert msgspec.json.decode(catalog.read_bytes()) == content


def test_a_version_4_index_as_main_wrote_it_reads_back_the_same(
    written: tuple[Path, Path],
) -> None:
    """Version 4 (an entry per held segment) is still read: the same segments, rows and
    files as the version 5 index it was converted from, and retention names the same."""
    segments, second = written
    rows = read_back(second, segments)
    summary = checkpoint_summary(second, segments)
    index = read_segmented_content(second, segments)
    index_as_version_4(second, segments)
    assert content_of(second)["segments"] and "whole" not in content_of(second)
    again = read_segmented_content(second, segments)
    assert (again.schema_version, index.schema_version) == (4, 5)
    assert again.segments == index.segments and again.catalogs == index.catalogs
    assert_same(read_back(second, segments), rows)
    assert checkpoint_summary(second, segments).files == summary.files
    assert referenced_segments([second]) == {path.name for path, _size in summary.files}


def _partition(content: dict[str, Any], name: str) -> int:
    return int(content["partitions"].index(name))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c, s, t: c.update(whole=[[s, 1, 1], [s, 2, 1], [t, 2, 1]]),
            r"whole\[1\]: \[1\]: the run from 2 touches the one before it",
        ),
        (
            lambda c, s, t: c.update(whole=[[s, 1, 0], [t, 2, 1]]),
            r"whole\[0\]: \[0\]: an empty run \(0 numbers\)",
        ),
        (
            lambda c, s, t: c.update(whole=[[7, 1, 1]]),
            r"whole\[0\]\[0\] \(partition\): 7 is not an index of \$.content.partitions",
        ),
        (
            lambda c, s, t: c.update(whole=[[t, 2, 1], [s, 1, 1]]),
            r"whole\[1\]\[0\] \(partition\): 0 comes after a later partition's runs",
        ),
        (
            lambda c, s, t: c.update(whole=[[s, 1, 1]], segments=[[2, t, []]]),
            r"segments\[0\]: '000002-train.segment.safetensors' holds only live entries: its "
            r"place is a run",
        ),
        (
            lambda c, s, t: c.update(segments=[[1, s, [1, 1]]]),
            r"segments\[0\]: '000001-rollout_staging.segment.safetensors' is in a run too",
        ),
        (
            lambda c, s, t: c.update(whole=[[s, 1, 1], [s, 5, 1], [t, 2, 1]]),
            r"whole\[0..\] \(segment 5\)\[0\] \(name\): segment "
            r"'000005-rollout_staging.segment.safetensors' is described by none",
        ),
        (
            lambda c, s, t: c.update(whole=[], segments=[[2, t, [0, 1]], [1, s, [0, 2]]]),
            r"segments\[1\]: '000001-rollout_staging.segment.safetensors' is not after "
            r"'000002-train.segment.safetensors' \(by file name\)",
        ),
    ],
)
def test_a_version_5_index_out_of_its_form_is_refused_naming_the_field(
    written: tuple[Path, Path], change: Any, message: str
) -> None:
    """Version 5's runs and entries have one spelling per set of held segments: runs by
    partition, maximal, never empty; an all-held numbered segment only in a run; the other
    entries by file name; no segment twice. Retention, which reads no catalog, refuses the
    same index when its form is wrong (it needs the names only)."""
    segments, second = written
    content = content_of(second)
    staging, train = _partition(content, STAGING_PARTITION), _partition(content, TRAIN_PARTITION)
    path = rewrite_content(second, lambda c: change(c, staging, train))
    refused(second, segments, path, message)
    if "described by none" in message:
        return  # the catalogs' checks: restore's, not retention's
    with pytest.raises(DataPlaneCheckpointError, match=message):
        referenced_segments([second])
