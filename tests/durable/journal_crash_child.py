"""Child process of the journal crash tests: appends, rotates and drops, or checks.

Run as ``python journal_crash_child.py <mode> <journal_dir>``, with the fault
variables of :mod:`rollvault.durable.faults` set to kill it at one step.

Modes:
  write  open the journal and append records whose payloads derive from their
         sequence numbers, every third one lazily (it rides on the next record's
         group); after each durable record print ``durable <seq>``;
         every 5 records rotate and drop the segments before the rotation
         (as a committed snapshot would allow), printing ``covered <seq>``
  check  repair and read the journal, then append one record; print a JSON report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rollvault.durable.journal_format import read_journal
from rollvault.durable.journal_writer import JournalWriter

RECORDS = 16


def payload(seq: int) -> bytes:
    return f"seal {seq} ".encode() * (1 + seq % 7)


def lazy(seq: int) -> bool:
    return seq % 3 == 1


def write(directory: Path) -> None:
    # One group per non-lazy record, each waited for, and a lazy record waits far
    # longer than any run for a group to ride on (the next record's, a rotation's or
    # the close's): the fault points are then hit the same number of times in every
    # run (group sizes would vary with timing).
    writer, _ = JournalWriter.open(directory, commit_interval_s=0.0, lazy_interval_s=600.0)
    first = writer.stats().appended_seq + 1
    for seq in range(first, first + RECORDS):
        assert writer.append(payload(seq), lazy=lazy(seq)) == seq
        if lazy(seq):
            # Not durable on its own: it rides on the next group, never after a later record.
            assert writer.durable_seq < seq
            print(f"lazy {seq}", flush=True)
        else:
            writer.wait_durable(seq, timeout=30)
            print(f"durable {writer.durable_seq}", flush=True)
        if seq % 5 == 4:
            new_first = writer.rotate()
            # Said before the drop: a kill inside it may already have deleted some.
            print(f"covered {new_first - 1}", flush=True)
            writer.drop_through(new_first - 1)
    writer.close()
    print(f"durable {writer.durable_seq}", flush=True)


def check(directory: Path) -> None:
    writer, repair = JournalWriter.open(directory, commit_interval_s=0.0)
    seqs = [record.seq for record in repair.replay.records]
    bad = [r.seq for r in repair.replay.records if r.payload != payload(r.seq)]
    appended = writer.append(payload(repair.replay.next_seq))
    writer.close()
    after = read_journal(directory)
    report = {
        "seqs": seqs,
        "bad_payloads": bad,
        "damage": None if repair.truncated is None else repair.truncated.kind.value,
        "appended": appended,
        "after_seqs": [record.seq for record in after.records],
        "after_damage": None if after.damage is None else after.damage.describe(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    mode, target = sys.argv[1], Path(sys.argv[2])
    {"write": write, "check": check}[mode](target)
