"""Per-step observability of ``rollvault run``: live progress, metrics.jsonl, TensorBoard."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from rollvault.cli.metrics_log import (
    METRICS_LOG_FILENAME,
    MetricsRecord,
    MetricsWriter,
    TensorBoardMirror,
    finite_metrics,
)
from rollvault.config.schema import RunConfig
from rollvault.controller.loop.parts import RolloutParts
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root
from rollvault.durable.trainer_checkpoints import trainer_checkpoint_path, trainer_checkpoint_steps

__all__ = ["StepMonitor", "newest_snapshot_time"]

_RATE_WINDOW_STEPS = 20


def newest_snapshot_time(checkpoint_dir: Path) -> float | None:
    """Modification time of the newest committed rollout snapshot or trainer checkpoint."""
    anchors = [checkpoint_dir / BOOTSTRAP_DIRNAME] + [
        trainer_checkpoint_path(checkpoint_dir, step)
        for step in trainer_checkpoint_steps(checkpoint_dir)
    ]
    candidates = list(anchors[1:])  # a trainer checkpoint holds a full snapshot too
    for anchor in anchors:
        candidates.extend(committed_snapshot_paths(snapshots_root(anchor)))
    newest = None
    for path in candidates:
        # Retention may prune a snapshot between the listing and the stat.
        with contextlib.suppress(FileNotFoundError):
            mtime = path.stat().st_mtime
            newest = mtime if newest is None else max(newest, mtime)
    return newest


class StepMonitor:
    """Turns each finished step into a metrics line, TensorBoard scalars and a status text."""

    def __init__(
        self,
        config: RunConfig,
        tokens_generated: Callable[[], int],
        *,
        on_status: Callable[[int, str], None] | None = None,
    ) -> None:
        log_dir = Path(config.logging.log_dir)
        self._checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
        self._tokens_generated = tokens_generated
        self._on_status = on_status
        self._writer = MetricsWriter(log_dir / METRICS_LOG_FILENAME)
        self.tensorboard = TensorBoardMirror(log_dir) if config.logging.tensorboard else None
        now = time.time()
        self._last = (now, 0)
        self._window: deque[tuple[float, int]] = deque([(now, 0)], maxlen=_RATE_WINDOW_STEPS + 1)
        self.steps = 0

    def on_step(self, parts: RolloutParts, metrics: dict[str, float]) -> None:
        """The pipeline's ``on_step`` callback."""
        now = time.time()
        tokens = self._tokens_generated()
        last_time, last_tokens = self._last
        elapsed = max(now - last_time, 1e-9)
        snapshot_time = newest_snapshot_time(self._checkpoint_dir)
        record = MetricsRecord(
            step=parts.trainer_version - 1,
            incarnation=parts.logs.incarnation,
            time=now,
            step_seconds=elapsed,
            rollout_tokens_per_s=(tokens - last_tokens) / elapsed,
            groups_in_flight=len(parts.ledger),
            buffered_groups=len(parts.replay),
            snapshot_age_s=None if snapshot_time is None else max(0.0, now - snapshot_time),
            trainer=finite_metrics(metrics),
        )
        self._writer.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        self._last = (now, tokens)
        self._window.append((now, tokens))
        self.steps += 1
        if self._on_status is not None:
            self._on_status(parts.trainer_version, self.status(record))

    def status(self, record: MetricsRecord) -> str:
        """One line: reward, accuracy, tokens/s, groups in flight, buffered, snapshot age."""
        (t0, n0), (t1, n1) = self._window[0], self._window[-1]
        rate = (n1 - n0) / max(t1 - t0, 1e-9)
        reward = record.metric("reward_mean")
        accuracy = record.metric("accuracy")
        age = record.snapshot_age_s
        return " ".join(
            [
                f"reward {'-' if reward is None else f'{reward:.3f}'}",
                f"acc {'-' if accuracy is None else f'{accuracy:.0%}'}",
                f"| {rate:,.0f} tok/s",
                f"| in flight {record.groups_in_flight}",
                f"buffered {record.buffered_groups}",
                f"| snapshot {'-' if age is None else f'{age:.0f}s ago'}",
            ]
        )

    def close(self) -> None:
        self._writer.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
