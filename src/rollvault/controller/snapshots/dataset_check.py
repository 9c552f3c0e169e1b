"""A resume refuses a dataset whose rows are not the ones the run started with.

Everything durable names a prompt by its dataset index. The run's bootstrap
anchor records every row's identity digest when it is created
(:mod:`rollvault.durable.dataset_identity`); every later start computes them
again and compares: another row count, or any row whose digest changed,
refuses the resume with :class:`~rollvault.durable.errors.DatasetChangedError`
(``rollvault run`` exits 2), naming the first changed rows and where they are
(``dataset index 3 (data.jsonl line 4)``). This is what catches a dataset file
edited under the same path; the restorer's per-group check only sees the
groups a snapshot holds in flight.

Computing the digests is one ``identity`` call a row: the 10,000 rows of the
addition task take about 30 ms (the whole check on resume, reading the
record included, the same); a file dataset's 10,000 rows about 10 ms, its
datums being encoded once as it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from rollvault.durable.dataset_identity import DatasetIdentity, read_dataset_identity
from rollvault.durable.errors import DatasetChangedError
from rollvault.tasks.protocols import PromptDataset, describe_row

__all__ = [
    "MAX_NAMED_ROWS",
    "check_dataset_unchanged",
    "dataset_differences",
    "dataset_identity",
]

MAX_NAMED_ROWS: Final = 5
"""Changed rows named one by one in the message; the rest are counted."""


def dataset_identity(dataset: PromptDataset) -> DatasetIdentity:
    """The identity digests of every row of ``dataset``, in index order."""
    return DatasetIdentity.of_rows([dataset.identity(idx) for idx in range(len(dataset))])


def check_dataset_unchanged(
    anchor: Path, dataset: PromptDataset, current: DatasetIdentity | None = None
) -> None:
    """Refuse ``dataset`` unless its rows are those ``anchor`` recorded.

    ``current`` is ``dataset_identity(dataset)`` when the caller has it. An
    anchor without a record (made before rollvault recorded datasets, or
    without a dataset) is not checked: that run resumes as it always did.
    """
    stored = read_dataset_identity(anchor)
    if stored is None:
        return
    current = current if current is not None else dataset_identity(dataset)
    differences = dataset_differences(stored, current, dataset)
    if differences:
        raise DatasetChangedError(anchor, differences)


def dataset_differences(
    stored: DatasetIdentity, current: DatasetIdentity, dataset: PromptDataset
) -> list[str]:
    """One line per difference: the row count, then the first changed rows, then how many more."""
    lines = []
    if stored.num_rows != current.num_rows:
        lines.append(_count_line(stored.num_rows, current.num_rows, dataset))
    changed = stored.changed_rows(current)
    lines += [f"{describe_row(dataset, idx)}: changed" for idx in changed[:MAX_NAMED_ROWS]]
    if len(changed) > MAX_NAMED_ROWS:
        lines.append(
            f"... and {len(changed) - MAX_NAMED_ROWS} more changed rows ({len(changed)} in all)"
        )
    return lines


def _count_line(before: int, now: int, dataset: PromptDataset) -> str:
    line = f"row count: {before} when the run started, {now} now"
    if now > before:
        return line + f"; the first new row is {describe_row(dataset, before)}"
    return line + f"; dataset indexes {now} to {before - 1} are gone"
