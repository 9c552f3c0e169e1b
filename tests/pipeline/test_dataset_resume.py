"""A resume refuses a dataset whose rows changed, naming the rows (and the file's lines).

The runs are the in-process pipeline on the simulated gate (which scores any
prompt by its response tokens), on a JSONL file dataset: the rows of the file
are the prompts, every one trained once per epoch across a crash, and a file
edited under the same path between two starts is refused by row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_helpers import (
    dataset_of,
    expected_prompts,
    run_simulated,
    run_until_crash,
    small_config,
)

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots.dataset_check import MAX_NAMED_ROWS, dataset_identity
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.durable.dataset_identity import read_dataset_identity
from rollvault.durable.errors import (
    DatasetChangedError,
    IncompatibleRunError,
    SnapshotManifestError,
)
from rollvault.durable.layout import BOOTSTRAP_DIRNAME, DATASET_IDENTITY_FILENAME
from rollvault.tasks.registry import build_dataset

NUM_ROWS = 24


def _rows(count: int = NUM_ROWS) -> list[dict[str, object]]:
    return [{"prompt": f"question {i}?", "answer": i} for i in range(count)]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _config(tmp_path: Path, data: Path, *overrides: str) -> RunConfig:
    return small_config(
        tmp_path,
        "dataset.kind=jsonl",
        f"dataset.path={data}",
        "checkpointing.save_period=4",
        "rollout_checkpointing.interval_s=0.05",
        *overrides,
    )


def _anchor(config: RunConfig) -> Path:
    return Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME


def _refusal(config: RunConfig) -> DatasetChangedError:
    with pytest.raises(DatasetChangedError) as info:
        prepare_checkpoint_dir(config, dataset=dataset_of(config))
    # An IncompatibleRunError: `rollvault run` shows it and exits 2.
    assert isinstance(info.value, IncompatibleRunError)
    return info.value


@pytest.fixture
def crashed_run(tmp_path: Path) -> tuple[RunConfig, Path]:
    """A JSONL run that died after step 3, and its file."""
    data = _write(tmp_path / "data.jsonl", _rows())
    config = _config(tmp_path, data)
    run_until_crash(config, 3)
    return config, data


def test_the_anchor_records_every_rows_identity(crashed_run: tuple[RunConfig, Path]) -> None:
    config, _ = crashed_run
    stored = read_dataset_identity(_anchor(config))
    dataset = dataset_of(config)
    assert stored is not None and stored.num_rows == NUM_ROWS
    assert [stored.row_digest(i) for i in range(NUM_ROWS)] == [
        dataset.identity(i) for i in range(NUM_ROWS)
    ]


def test_an_unchanged_file_resumes_and_trains_every_row_once(
    crashed_run: tuple[RunConfig, Path],
) -> None:
    config, _ = crashed_run
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    assert len(history.restores) == 1
    assert check_exactly_once(history, expected_prompts(NUM_ROWS, 2)) == []


def test_a_changed_row_is_refused_by_index_and_line(crashed_run: tuple[RunConfig, Path]) -> None:
    config, data = crashed_run
    rows = _rows()
    rows[5]["answer"] = 500  # the answer only: the prompt text is the same
    _write(data, rows)
    error = _refusal(config)
    assert error.differences == [f"dataset index 5 ({data} line 6): changed"]
    assert "the dataset differs from the one the run started with" in str(error)
    assert str(_anchor(config)) in str(error)


def test_an_appended_row_is_refused_naming_the_new_line(
    crashed_run: tuple[RunConfig, Path],
) -> None:
    config, data = crashed_run
    _write(data, _rows(NUM_ROWS + 1))
    error = _refusal(config)
    assert error.differences == [
        f"row count: {NUM_ROWS} when the run started, {NUM_ROWS + 1} now; the first new row "
        f"is dataset index {NUM_ROWS} ({data} line {NUM_ROWS + 1})"
    ]


def test_a_removed_row_shifts_the_rest_and_all_is_said(crashed_run: tuple[RunConfig, Path]) -> None:
    config, data = crashed_run
    rows = _rows()
    del rows[20]
    _write(data, rows)
    error = _refusal(config)
    assert error.differences == [
        f"row count: {NUM_ROWS} when the run started, {NUM_ROWS - 1} now; dataset indexes "
        f"{NUM_ROWS - 1} to {NUM_ROWS - 1} are gone",
        *(f"dataset index {i} ({data} line {i + 1}): changed" for i in (20, 21, 22)),
    ]


def test_many_changed_rows_are_counted_past_the_first_few(
    crashed_run: tuple[RunConfig, Path],
) -> None:
    config, data = crashed_run
    rows = _rows()
    for row in rows[2:10]:
        row["prompt"] = f"{row['prompt']} (edited)"
    _write(data, rows)
    error = _refusal(config)
    named = [
        f"dataset index {i} ({data} line {i + 1}): changed" for i in range(2, 2 + MAX_NAMED_ROWS)
    ]
    assert error.differences == [
        *named,
        f"... and {8 - MAX_NAMED_ROWS} more changed rows (8 in all)",
    ]


def test_a_moved_file_with_the_same_rows_resumes(
    tmp_path: Path, crashed_run: tuple[RunConfig, Path]
) -> None:
    config, data = crashed_run
    moved = data.rename(tmp_path / "elsewhere.jsonl")
    resumed = _config(tmp_path, moved)
    assert prepare_checkpoint_dir(resumed, dataset=dataset_of(resumed)) is not None


def test_an_anchor_without_the_record_resumes_unchecked(
    crashed_run: tuple[RunConfig, Path],
) -> None:
    # An anchor written before rollvault recorded datasets: resumed as it always was.
    config, data = crashed_run
    (_anchor(config) / DATASET_IDENTITY_FILENAME).unlink()
    _write(data, _rows(NUM_ROWS + 1))
    assert prepare_checkpoint_dir(config, dataset=dataset_of(config)) is not None


def test_a_damaged_record_is_not_taken_for_a_changed_dataset(
    crashed_run: tuple[RunConfig, Path],
) -> None:
    config, _ = crashed_run
    path = _anchor(config) / DATASET_IDENTITY_FILENAME
    record = json.loads(path.read_text(encoding="utf-8"))
    digests = record["row_digests"]
    record["row_digests"] = ("B" if digests[0] != "B" else "C") + digests[1:]
    path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(SnapshotManifestError, match=f"{path}: corrupt: its row digests fail"):
        prepare_checkpoint_dir(config, dataset=dataset_of(config))


def test_a_built_in_task_with_other_rows_is_refused_by_dataset_index(tmp_path: Path) -> None:
    config = small_config(tmp_path, "dataset.kind=addition", "dataset.num_prompts=50")
    prepare_checkpoint_dir(config, dataset=dataset_of(config))  # a first start's anchor
    # A changed seed changes every row, but the config says it first, and better.
    reseeded = small_config(tmp_path, "dataset.kind=addition", "dataset.num_prompts=50", "seed=3")
    with pytest.raises(IncompatibleRunError) as info:
        prepare_checkpoint_dir(reseeded, dataset=dataset_of(reseeded))
    assert not isinstance(info.value, DatasetChangedError)
    assert info.value.differences == ["seed: 0 -> 3"]
    # Other rows under the same config (a task whose data changed under it): by index.
    other = build_dataset(config.dataset, vocab_size=2, seed=3)
    with pytest.raises(DatasetChangedError) as changed:
        prepare_checkpoint_dir(config, dataset=other)
    assert changed.value.differences[0] == "dataset index 0: changed"
    assert changed.value.differences[-1].endswith("more changed rows (50 in all)")


def test_a_start_without_a_dataset_records_and_checks_nothing(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    anchor = _anchor(config)
    anchor.mkdir(parents=True)
    # Left by a start killed between this file and its manifest: not this anchor's.
    (anchor / DATASET_IDENTITY_FILENAME).write_text("{}", encoding="utf-8")
    assert prepare_checkpoint_dir(config) is None
    assert not (anchor / DATASET_IDENTITY_FILENAME).exists()
    assert prepare_checkpoint_dir(config, dataset=dataset_of(config)) is not None


def test_identities_of_the_addition_tasks_rows_are_cheap(tmp_path: Path) -> None:
    # A record of all 10,000 rows: computed and stored on every fresh start.
    config = small_config(tmp_path, "dataset.kind=addition", "dataset.num_prompts=10000")
    dataset = dataset_of(config)
    prepare_checkpoint_dir(config, dataset=dataset)
    stored = read_dataset_identity(_anchor(config))
    assert stored == dataset_identity(dataset)
    assert (_anchor(config) / DATASET_IDENTITY_FILENAME).stat().st_size < 60 * 10_000
