"""A start computes the run's identity once: every model file is digested once.

The identity (the config less operational paths, plus each model file's
digest) decides whether a start may resume and is the fingerprint its
snapshots carry; a start used to compute it twice on a fresh start and read
the anchor's manifest twice on a resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import run_simulated, small_config

from rollvault.controller.snapshots import resume
from rollvault.durable.bootstrap import read_bootstrap_manifest
from rollvault.durable.file_digests import directory_digests
from rollvault.durable.layout import BOOTSTRAP_DIRNAME


def test_each_start_digests_the_model_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    digested: list[Path] = []

    def counting_digests(directory: Path) -> dict[str, str]:
        digested.append(directory)
        return directory_digests(directory)

    monkeypatch.setattr(resume, "directory_digests", counting_digests)
    overrides = (f"model.path={model}", "dataset.num_prompts=8", "grpo.max_num_epochs=1")

    fresh = small_config(tmp_path, *overrides, "grpo.max_num_steps=1")
    run_simulated(fresh)
    assert digested == [model]
    anchor = Path(fresh.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME
    assert read_bootstrap_manifest(anchor).fingerprint == resume.run_identity(fresh).fingerprint()

    digested.clear()
    resumed = small_config(tmp_path, *overrides, "grpo.max_num_steps=2")
    summary, _ = run_simulated(resumed)
    assert digested == [model]
    assert summary.trainer_version == 2 and summary.incarnation == 2
