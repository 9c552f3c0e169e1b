"""The chaos harness on the Ray recipe: SIGKILL the whole driver, restart, check exactly-once.

A killed driver cannot stop its private Ray; the restart must kill exactly
that Ray's processes before starting its own, and the finished run leaves
no process of it behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import rollvault
from rollvault.checkpoint_tools.chaos.plan import ChaosPlan, chaos_config
from rollvault.checkpoint_tools.chaos.supervisor import CHILD_OUTPUT_FILENAME
from rollvault.cli.main import main
from rollvault.recipes.ray_processes import marked_processes
from rollvault.recipes.ray_runtime import private_temp_dir

RAY_RECIPE = Path(rollvault.__file__).parent / "configs" / "grpo_addition_ray.yaml"
KILLS = 1


@pytest.mark.slow
def test_the_ray_recipe_survives_driver_kills_and_leaves_no_ray_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One epoch of 24 prompts (6 steps): start-up (Ray, 3 actors, the model) dominates anyway.
    overrides = ["trainer.warmup.steps=10", "grpo.max_num_epochs=1", "dataset.num_prompts=24"]
    argv = ["chaos", "--config", str(RAY_RECIPE), "--kills", str(KILLS), "--seed", "4",
            "--kill-window", "6", "--workdir", str(tmp_path)]  # fmt: skip
    exit_code = main([*argv, *overrides])
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert f"{KILLS} kills, {KILLS + 1} starts" in out
    assert "OK: every prompt trained exactly once" in out
    run_dir = tmp_path / "latest"
    # The restart found the killed driver's Ray still running and killed it.
    output = (run_dir / CHILD_OUTPUT_FILENAME).read_text()
    assert output.count("processes of the private Ray a killed start left") == KILLS
    # Nothing of any start's Ray is left (the temp dir is the run's, whatever the start).
    plan = ChaosPlan(
        run_dir=run_dir, kills=KILLS, overrides=tuple(overrides), config_path=RAY_RECIPE
    )
    assert marked_processes(str(private_temp_dir(chaos_config(plan)))) == []
