"""A segment of the newest snapshot damaged: verification names it, restore falls back.

Row, ledger and fact segments are all checked the same way before a run
resumes from a snapshot; each kind's tests damage one of the newest
snapshot's own segments and check that here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pipeline_helpers import dataset_of
from test_incremental_snapshots import SIBLINGS

from rollvault.config.schema import RunConfig
from rollvault.controller.snapshots.resume import prepare_checkpoint_dir
from rollvault.controller.snapshots.verification import (
    ProblemKind,
    VerificationLevel,
    verify_snapshot,
)

DAMAGES = ("missing", "flipped", "truncated")


def damage_segment(segment: Path, damage: str, *, flip: tuple[bytes, bytes], kind: str) -> str:
    """Damage ``segment`` (``damage`` one of :data:`DAMAGES`; ``flip`` replaces the first
    occurrence of its first bytes with its second) and return what a check must say."""
    data = segment.read_bytes()
    if damage == "missing":
        segment.unlink()
        return f"missing {kind} segment"
    if damage == "flipped":
        assert flip[0] in data, f"{segment} holds no {flip[0]!r} to flip"
        segment.write_bytes(data.replace(flip[0], flip[1], 1))
        return "SHA-256"
    assert damage == "truncated", damage
    segment.write_bytes(data[:-7])
    return "truncated or overwritten"


def assert_restore_falls_back(
    config: RunConfig,
    *,
    older: Path,
    newest: Path,
    segment: Path,
    expected: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``newest``'s verification names ``segment`` as damaged, and restore takes ``older``."""
    verification = verify_snapshot(
        newest, generations_per_group=SIBLINGS, level=VerificationLevel.RESTORABLE
    )
    (problem,) = verification.problems
    assert problem.kind is ProblemKind.DAMAGED and problem.path == segment
    assert expected in problem.problem
    with caplog.at_level(logging.WARNING):
        source = prepare_checkpoint_dir(config, dataset=dataset_of(config))
    assert source is not None and source.snapshot is not None
    assert source.snapshot.path == older
    assert str(segment) in caplog.text
