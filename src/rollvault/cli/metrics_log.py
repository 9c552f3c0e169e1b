"""``<log_dir>/metrics.jsonl``: one line per optimizer step, for people and plots.

Each line holds the step (0-based, as in ``train_log.jsonl``), the start
(incarnation) that trained it, throughput, the pipeline's state, and the
trainer's own metrics (loss, reward mean, accuracy, ...). Lines are appended
and flushed one at a time; a SIGKILL can tear only the last one, which the
reader drops and the next start's writer cuts off. A restore that trains a
step again appends it again: the last line of a step is the one that counts.

When ``logging.tensorboard`` is set and the ``tensorboard`` package is
installed, the same scalars also go to TensorBoard event files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO, Any

import msgspec

__all__ = [
    "METRICS_LOG_FILENAME",
    "MetricsRecord",
    "MetricsWriter",
    "TensorBoardMirror",
    "effective_metrics",
    "read_metrics",
]

METRICS_LOG_FILENAME = "metrics.jsonl"


class MetricsRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One optimizer step as ``metrics.jsonl`` records it."""

    step: int
    incarnation: int
    time: float
    """Unix time when the step finished."""
    step_seconds: float
    """Wall time since the previous step of this start (or since the start)."""
    rollout_tokens_per_s: float
    """Response tokens the gate generated per second over that interval."""
    groups_in_flight: int
    buffered_groups: int
    snapshot_age_s: float | None
    """Age of the newest committed rollout snapshot (None: none yet)."""
    trainer: dict[str, float]
    """The trainer's metrics for the step (finite values only)."""

    def metric(self, name: str) -> float | None:
        return self.trainer.get(name)


def finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Drop NaN and infinities: JSON has no spelling for them."""
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


class MetricsWriter:
    """Appends :class:`MetricsRecord` lines, flushed per line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed in close()
        data = path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete != len(data):
            # A previous start died mid-line: keep complete lines only.
            self._file.truncate(complete)
        self._encoder = msgspec.json.Encoder()

    def write(self, record: MetricsRecord) -> None:
        self._file.write(self._encoder.encode(record) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[MetricsRecord]:
    """Every complete line of ``path`` (a torn last line is dropped)."""
    if not path.exists():
        return []
    decoder = msgspec.json.Decoder(MetricsRecord)
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines[:-1]):
        try:
            records.append(decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number + 1}: damaged metrics line: {exc}") from exc
    return records


def effective_metrics(records: list[MetricsRecord]) -> list[MetricsRecord]:
    """One record per step, the last one written (a retrained step replaces the earlier)."""
    by_step: dict[int, MetricsRecord] = {}
    for record in records:
        by_step[record.step] = record
    return [by_step[step] for step in sorted(by_step)]


class TensorBoardMirror:
    """Writes each record's scalars as TensorBoard events, if tensorboard is installed."""

    def __init__(self, log_dir: Path) -> None:
        self.unavailable_reason: str | None = None
        self._writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            self.unavailable_reason = f"tensorboard is not installed ({exc})"
            return
        self._writer = SummaryWriter(log_dir=str(log_dir / "tensorboard"))

    def write(self, record: MetricsRecord) -> None:
        if self._writer is None:
            return
        scalars = {
            "rollout_tokens_per_s": record.rollout_tokens_per_s,
            "groups_in_flight": float(record.groups_in_flight),
            **{f"trainer/{k}": v for k, v in record.trainer.items()},
        }
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, record.step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
