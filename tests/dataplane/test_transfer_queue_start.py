"""TransferQueue's start on a Ray with too few CPUs fails with a clear message, not a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rollvault

SRC = Path(rollvault.__file__).resolve().parent.parent

# In a child process: the timed-out init leaves a thread blocked in Ray, and the
# child's Ray (1 logical CPU) must not meet the one the other tests here share.
SCRIPT = textwrap.dedent(
    """
    import shutil, sys, tempfile, time
    import ray
    from rollvault.dataplane.tq import (
        TransferQueueSettings, TransferQueueStartError, start_transfer_queue,
    )
    temp_dir = tempfile.mkdtemp(prefix="rv-tq-", dir="/tmp")
    ray.init(address="local", _temp_dir=temp_dir, num_cpus=1, include_dashboard=False,
             log_to_driver=False)
    started = time.monotonic()
    try:
        start_transfer_queue(TransferQueueSettings(num_storage_units=1, init_timeout_s=4))
    except TransferQueueStartError as error:
        print(f"{time.monotonic() - started:.1f}")
        print(error)
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        sys.exit(0)
    sys.exit("started on 1 CPU")
    """
)


@pytest.mark.slow
def test_init_on_too_few_cpus_times_out_naming_the_cpus() -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seconds, message = done.stdout.split("\n", 1)
    assert 4 <= float(seconds) < 60
    assert "transfer_queue.init did not finish within 4 s" in message
    assert "Ray has 1 logical CPUs" in message
    assert "1 storage unit(s) need 2 of them" in message
    assert "dataplane.transfer_queue.num_storage_units" in message
