"""A sealed attempt's reward and checks in ``attempts.jsonl``; lines of older versions still read."""

from __future__ import annotations

from pathlib import Path

from rollvault.controller.loop.run_logs import (
    AttemptLogRecord,
    JsonlWriter,
    LogSequence,
    read_jsonl,
)
from rollvault.ledger.statuses import RolloutAttemptStatus

OLD_LINE = (
    b'{"gate_rollout_id":"g_g0_a1","group_id":"g","generation_index":0,"status":"sealed",'
    b'"num_tokens":3,"incarnation":1,"reason":null,"seq":4}\n'
)


def test_a_sealed_attempt_logs_its_reward_and_checks_and_old_lines_still_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "attempts.jsonl"
    path.write_bytes(OLD_LINE)  # written before attempts carried reward and checks
    writer = JsonlWriter[AttemptLogRecord](path, LogSequence(4))
    writer.write(
        AttemptLogRecord(
            gate_rollout_id="g_g1_a2",
            group_id="g",
            generation_index=1,
            status=RolloutAttemptStatus.SEALED,
            num_tokens=2,
            incarnation=1,
            reward=0.25,
            checks={"format_ok": True, "correct": False, "similarity": 0.5},
        )
    )
    writer.close()
    old, new = read_jsonl(path, AttemptLogRecord)
    assert (old.reward, old.checks, old.seq) == (None, None, 4)
    assert new.reward == 0.25 and new.seq == 5
    assert new.checks == {"format_ok": True, "correct": False, "similarity": 0.5}
    assert type(new.checks["correct"]) is bool and type(new.checks["similarity"]) is float
