"""The seal journal's cost per step, measured inside one run: its seals on and off in blocks.

``bench_grpo_run.py`` compares whole runs with and without the journal. On
this machine the host's CPU speed drifts by tens of percent within a minute,
so a run's steps/s moves by ~10% between neighbouring runs and a 1% cost
takes hundreds of paired rounds to see. Here one run (the recipe with the
journal on, as ``bench_grpo_run.py``'s journal arm) hands its generation
batches' seals to the journal in blocks of ``--block`` train steps and
drops them (``SealJournal.seal_many`` hands nothing over: no packing, no
encoding, no writer) in the blocks between; the finalize and step records
are journaled throughout. Neighbouring blocks are ~1 s apart, so the drift
hits both alike. The first ``--skip`` steps of each block are left out (a
batch sealed just before a switch is written in the next block).

The figure: per pair of neighbouring blocks, the median step time of the
"off" block over that of the "on" block (the journal's throughput ratio,
1.0 = free), and the median of the pairs with a bootstrap 95% interval.
What it measures is the cost of journaling the seals (with their rows):
the records the other arm never writes. What it leaves out: anything
the journal costs whether or not seals flow (its writer idle, the
finalize and step records, the journal's segment start and rotations).
The writer is the recipe's (a process since stop 43); ``--set
rollout_checkpointing.journal.writer=thread`` measures the thread writer.

A measurement aid only: it replaces a method of this process's class before the
runs, so the run's durability in its "off" blocks is not the recipe's.

``--control`` hands the seals over in every block: an A/A run, whose figure is
the method's own bias and spread (it should read ~1.0).

Usage: python benchmarks/bench_journal_blocks.py [--runs N] [--steps N] [--block N]
       [--skip N] [--control] [--set DOTPATH=VALUE ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_grpo_run  # noqa: E402  (beside this script, not a package)

from rollvault.controller.loop.seal_journal import SealJournal  # noqa: E402


class SealSwitch:
    """Counts the journal's train steps and hands seals over only in the "on" blocks."""

    def __init__(self, block: int, *, control: bool = False) -> None:
        self.block = block
        self.control = control
        """Hand every seal over in both kinds of block (an A/A run: the method's own bias)."""
        self.steps = 0
        self._seal_many = SealJournal.seal_many
        self._step = SealJournal.step

    def on(self) -> bool:
        return self.control or (self.steps // self.block) % 2 == 0

    def install(self) -> None:
        switch = self

        def seal_many(journal: SealJournal, entries: list[Any]) -> range | None:
            return switch._seal_many(journal, entries) if switch.on() else None

        def step(journal: SealJournal, trainer_version: int, group_ids: list[str]) -> int | None:
            switch.steps += 1
            return switch._step(journal, trainer_version, group_ids)

        SealJournal.seal_many = seal_many  # type: ignore[method-assign,assignment]
        SealJournal.step = step  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        SealJournal.seal_many = self._seal_many  # type: ignore[method-assign]
        SealJournal.step = self._step  # type: ignore[method-assign]


def block_ratios(step_seconds: list[float], block: int, skip: int) -> list[float]:
    """Per pair of neighbouring blocks (each block in one pair): the median step time of
    its "on" block over that of its "off" block.

    Step ``i`` of ``step_seconds`` runs from the ``i``-th step mark to the next, while
    the journal has counted about ``i + 1`` train steps: it is "on" when
    ``(i + 1) // block`` is even. Incomplete blocks (the first, the last) are left out.
    """
    blocks: list[tuple[bool, list[float]]] = []
    for i, seconds in enumerate(step_seconds):
        state = ((i + 1) // block) % 2 == 0
        if not blocks or blocks[-1][0] != state:
            blocks.append((state, []))
        blocks[-1][1].append(seconds)
    whole = [(state, times[skip:]) for state, times in blocks if len(times) == block]
    ratios = []
    for (first_on, first), (_, second) in zip(whole[::2], whole[1::2], strict=False):
        with_seals, without = (first, second) if first_on else (second, first)
        ratios.append(statistics.median(with_seals) / statistics.median(without))
    return ratios


def geometric_rate_ratio(time_ratios: list[float]) -> float:
    """The rate ratio of the pairs' geometric mean: unlike the arithmetic mean of the
    inverted ratios, not pulled below 1 by symmetric noise (what pooling runs uses)."""
    return math.exp(-statistics.mean(map(math.log, time_ratios)))


def bootstrap_interval(values: list[float], draws: int = 4000) -> tuple[float, float]:
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the recipe, one after another")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per run")
    parser.add_argument("--block", type=int, default=10, help="train steps per block")
    parser.add_argument("--skip", type=int, default=2, help="steps left out at a block's start")
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A run: seals handed over in every block (the figure should read ~1.0)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="DOTPATH=VALUE")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    if not 0 <= args.skip < args.block:
        parser.error(f"--skip must be >= 0 and below --block ({args.block}), got {args.skip}")
    all_ratios: list[float] = []
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_blocks_") as name:
        tmp = Path(name)
        model_dir, _ = bench_grpo_run.warm_model(tmp)
        for run in range(args.runs):
            switch = SealSwitch(args.block, control=args.control)
            switch.install()
            try:
                result = bench_grpo_run.run_arm(
                    "snapshots", tmp / f"run{run}", model_dir, args.steps, args.set, probes=False
                )
            finally:
                switch.remove()
            ratios = block_ratios(result.step_seconds, args.block, args.skip)
            all_ratios += ratios
            runs.append({"steps_per_s": result.steps_per_s, "ratios": ratios})
            print(
                f"run {run}: {result.steps_per_s:5.2f} steps/s, {len(ratios)} block pairs, "
                f"journal on / off step rate: median {1 / statistics.median(ratios):.3f}",
                flush=True,
            )
    low, high = bootstrap_interval(all_ratios)
    median = statistics.median(all_ratios)
    print(
        f"step rate with the journal's seals / without, {len(all_ratios)} block pairs: median "
        f"{1 / median:.3f} (95% interval {1 / high:.3f}-{1 / low:.3f}), "
        f"mean {1 / statistics.mean(all_ratios):.3f}, geometric mean "
        f"{geometric_rate_ratio(all_ratios):.3f}"
    )
    if args.json:
        payload = {
            "runs": runs,
            "rate_ratio": 1 / median,
            "interval": [1 / high, 1 / low],
            "geometric_rate_ratio": geometric_rate_ratio(all_ratios),
        }
        print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
