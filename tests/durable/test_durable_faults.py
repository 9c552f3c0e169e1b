"""The fault-injection hook: parsing, tracing and killing in a real child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollvault.durable import faults
from rollvault.durable.faults import FAULT_POINTS, KILL_AT_ENV, TRACE_ENV, plan_from_environment

_CHILD = """
from rollvault.durable.faults import fault_point
for _ in range(3):
    fault_point("commit.before_rename")
    print("passed", flush=True)
"""


def _run_child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, TRACE_ENV)}
    return subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_no_variables_means_no_plan() -> None:
    assert plan_from_environment({}) is None
    assert plan_from_environment({KILL_AT_ENV: "", TRACE_ENV: ""}) is None


def test_this_test_process_has_no_active_plan() -> None:
    assert faults._PLAN is None
    faults.fault_point("not a listed name")  # inert without a plan: no check, no cost


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("commit.before_rename", "expected '<fault point name>:<nth hit"),
        ("commit.before_rename:0", "expected '<fault point name>:<nth hit"),
        ("commit.before_rename:x", "expected '<fault point name>:<nth hit"),
        (":2", "expected '<fault point name>:<nth hit"),
        ("no.such.point:1", "'no.such.point' is not a name listed in FAULT_POINTS"),
    ],
)
def test_bad_kill_at_values_are_refused_naming_the_variable(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=f"{KILL_AT_ENV}=") as info:
        plan_from_environment({KILL_AT_ENV: raw})
    assert problem in str(info.value)


def test_active_plan_refuses_unlisted_names(tmp_path: Path) -> None:
    plan = plan_from_environment({TRACE_ENV: str(tmp_path / "trace")})
    assert plan is not None
    with pytest.raises(
        ValueError, match=r"fault_point\('bogus'\): not a name listed in FAULT_POINTS"
    ):
        plan.hit("bogus")


def test_trace_lists_every_hit_in_order(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    done = _run_child(tmp_path, **{TRACE_ENV: str(trace)})
    assert done.returncode == 0, done.stderr
    assert trace.read_text().splitlines() == ["commit.before_rename"] * 3


def test_kill_at_nth_hit_kills_the_child_there(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    done = _run_child(tmp_path, **{TRACE_ENV: str(trace), KILL_AT_ENV: "commit.before_rename:2"})
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["passed"]
    assert trace.read_text().splitlines() == ["commit.before_rename"] * 2


def test_every_listed_point_is_called_somewhere_in_the_durable_layer() -> None:
    source = "".join(
        path.read_text()
        for path in Path(faults.__file__).parent.glob("*.py")
        if path.name != "faults.py"
    )
    unused = sorted(name for name in FAULT_POINTS if f'fault_point("{name}")' not in source)
    assert unused == []
