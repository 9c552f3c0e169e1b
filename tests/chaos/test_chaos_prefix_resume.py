"""A SIGKILL through ``rollvault run`` while turns are mid-generation: prefixes are resumed.

The local model gate on the reverse recipe, responses of up to 32 tokens
generated in chunks of 4 (``rollout.prefix_resume=keep``). The run is killed
as soon as the seal journal holds a partial of an attempt that has not
sealed; the restart must continue such turns after their journaled prefix
(``restores.jsonl``'s ``prefix_tokens_resumed``) and the finished run must
pass the chaos harness's checks (every prompt trained exactly once, sealed
siblings reused, a clean final state).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import rollvault
from rollvault.checkpoint_tools.chaos.checks import check_finished_run
from rollvault.checkpoint_tools.chaos.plan import (
    ChaosPlan,
    chaos_config,
    child_command,
    run_overrides,
)
from rollvault.cli.metrics_log import METRICS_LOG_FILENAME, read_metrics
from rollvault.controller.loop.journal_rows import SealJournalRecordError
from rollvault.controller.loop.seal_journal import (
    SEAL_JOURNAL_DIRNAME,
    PartialRecord,
    SealRecord,
    decode_replay,
)
from rollvault.durable.journal_format import read_journal

RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_reverse.yaml"
OVERRIDES = (
    "dataset.num_prompts=8",
    "grpo.max_num_epochs=1",
    "trainer.warmup.steps=0",  # an untrained model: long responses, cut at max_new_tokens
    "gate.local_model.max_new_tokens=32",
    "reward.max_response_tokens=33",
    "rollout.prefix_resume=keep",
    "rollout.prefix_resume_tokens=4",
    "model.path=model",
    "logging.tensorboard=false",
    "checkpointing.save_period=1000",
)
TIMEOUT_S = 300.0
PREFIX_TOKENS_METRIC = "journal/prefix_tokens_resumed"


def _unsealed_partial(journal_dir: Path) -> bool:
    """Whether the journal on disk holds a partial of an attempt that has not sealed."""
    if not journal_dir.is_dir():
        return False
    try:
        records = decode_replay(read_journal(journal_dir))
    except (SealJournalRecordError, OSError, ValueError):
        return False  # caught mid-write: look again
    sealed = {r.entry.gate_rollout_id for r in records if isinstance(r.entry, SealRecord)}
    return any(
        isinstance(r.entry, PartialRecord) and r.entry.gate_rollout_id not in sealed
        for r in records
    )


def _prefix_tokens_resumed(log_dir: Path, *, incarnation: int) -> float:
    """The prefix tokens the start ``incarnation`` continued after (``metrics.jsonl``)."""
    records = read_metrics(log_dir / METRICS_LOG_FILENAME)
    values = [
        record.metric(PREFIX_TOKENS_METRIC) or 0.0
        for record in records
        if record.incarnation == incarnation
    ]
    return max(values, default=0.0)


def _start(plan: ChaosPlan, output: Path) -> subprocess.Popen[bytes]:
    with open(output, "ab") as handle:
        return subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            child_command(plan.config_path, run_overrides(plan)),
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=plan.run_dir,
        )


def _kill_with_an_unsealed_partial(plan: ChaosPlan, output: Path, journal_dir: Path) -> bool:
    """Start the run, SIGKILL it once the journal holds a partial of an unsealed attempt.

    Whether the journal still holds one after the kill: the attempt can seal (and its
    seal be journaled) between the look and the kill, and then there is nothing to resume.
    """
    child = _start(plan, output)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not _unsealed_partial(journal_dir):
            assert child.poll() is None, f"the run ended before a partial: {output.read_text()}"
            assert time.monotonic() < deadline, "no partial was journaled in time"
            time.sleep(0.05)  # a poll of the disk, not a synchronization
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return _unsealed_partial(journal_dir)


@pytest.mark.slow
def test_a_kill_mid_turn_resumes_the_journaled_prefixes_and_trains_every_prompt_once(
    tmp_path: Path,
) -> None:
    for tries in range(1, 4):
        plan = ChaosPlan(
            run_dir=tmp_path / f"run{tries}", kills=1, config_path=RECIPE, overrides=OVERRIDES
        )
        config = chaos_config(plan)
        plan.run_dir.mkdir()
        output = plan.run_dir / "child_output.log"
        journal_dir = Path(config.checkpointing.checkpoint_dir) / SEAL_JOURNAL_DIRNAME
        if _kill_with_an_unsealed_partial(plan, output, journal_dir):
            break
    else:
        pytest.fail("three runs in a row sealed every journaled partial before the kill")
    again = _start(plan, output)
    try:
        assert again.wait(timeout=TIMEOUT_S) == 0, output.read_text()[-4000:]
    finally:
        if again.poll() is None:
            os.kill(again.pid, signal.SIGKILL)
            again.wait()
    check = check_finished_run(config)
    assert check.problems == []
    (restore,) = check.history.restores
    # A partial of a group the snapshot holds is resumed by the restore itself; one of a
    # group reserved after the snapshot (the kill can come first) waits in the pool for
    # its prompt's next group, and is resumed there: the start's metric counts both.
    resumed = _prefix_tokens_resumed(Path(config.logging.log_dir), incarnation=2)
    assert restore.prefix_tokens_resumed > 0 or restore.journal_partials_pooled > 0, restore
    assert resumed >= restore.prefix_tokens_resumed and resumed > 0, (resumed, restore)
    assert restore.prefix_tokens_resumed == sum(restore.prefixes_resumed.values())
    # Prefixes sit on chunk boundaries, short of the whole response.
    assert all(0 < n < 32 and n % 4 == 0 for n in restore.prefixes_resumed.values())
