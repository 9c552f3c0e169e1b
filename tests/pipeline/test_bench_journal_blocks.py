"""The block benchmark's pairing: each "on" block against its neighbouring "off" block."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_journal_blocks import block_ratios  # noqa: E402


def _steps(count: int, block: int, on_seconds: float, off_seconds: float) -> list[float]:
    # Step i runs while the journal has counted i + 1 train steps (see block_ratios).
    return [on_seconds if ((i + 1) // block) % 2 == 0 else off_seconds for i in range(count)]


def test_pairs_compare_on_blocks_with_off_blocks() -> None:
    ratios = block_ratios(_steps(42, 4, 1.1, 1.0), block=4, skip=1)
    # Steps 0-2 (an incomplete first block) and the incomplete last block are left out:
    # whole blocks start at steps 3, 7, ..., 35 (steps 39-41 are a short last block), so
    # nine whole blocks make four pairs.
    assert ratios == pytest.approx([1.1] * 4)


def test_skipped_steps_are_left_out_of_each_block() -> None:
    steps = _steps(42, 4, 1.1, 1.0)
    for start in range(3, 42, 4):
        # The first two steps of every block (left out with skip=2): slow enough to move
        # a block's median when they are counted.
        steps[start] = steps[start + 1] = 50.0
    assert block_ratios(steps, block=4, skip=2) == pytest.approx([1.1] * 4)
    assert block_ratios(steps, block=4, skip=0) != pytest.approx([1.1] * 4)
