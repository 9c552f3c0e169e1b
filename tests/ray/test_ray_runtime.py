"""A private Ray is the driver's to stop, and only Ray's processes go with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ray_helpers import private_ray

from rollvault.recipes.ray_processes import marked_processes

pytestmark = pytest.mark.slow


def test_stopping_a_private_ray_leaves_the_drivers_other_children_running(
    tmp_path: Path,
) -> None:
    # A child the driver had before Ray started (as multiprocessing's resource tracker
    # is in a process that spawned anything): it descends from the driver too.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with private_ray(tmp_path / "run", num_cpus=1) as session:
            assert session.temp_dir is not None
        assert other.poll() is None, "stopping Ray killed a child of the driver that is not Ray's"
        assert marked_processes(str(session.temp_dir)) == []
    finally:
        other.kill()
        other.wait()
