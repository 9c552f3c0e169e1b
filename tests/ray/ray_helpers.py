"""A private Ray for one test module, started and stopped as a run starts and stops it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from rollvault.config.loading import load_run_config
from rollvault.config.schema import RunConfig
from rollvault.recipes.ray_runtime import RaySession, ray_runtime


def ray_config(run_dir: Path, *overrides: str) -> RunConfig:
    """A config that uses Ray, with its checkpoint dir (hence its Ray temp dir) in ``run_dir``."""
    return load_run_config(
        None,
        [
            "gate.kind=ray",
            "trainer.kind=grpo",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            f"logging.log_dir={run_dir / 'logs'}",
            *overrides,
        ],
    )


@contextlib.contextmanager
def private_ray(run_dir: Path, num_cpus: int = 4) -> Iterator[RaySession]:
    with ray_runtime(ray_config(run_dir, f"ray.num_cpus={num_cpus}")) as session:
        assert session is not None
        yield session
