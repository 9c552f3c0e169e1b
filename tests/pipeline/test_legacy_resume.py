"""A run an older rollvault wrote, before a setting existed, resumes under the new code.

The older code is simulated by a run identity without ``rollout.prefix_resume``
and ``reward.timeout_s`` (both added since): that run crashes, the new code
resumes it twice. It must train every prompt once, carry the anchor's
fingerprint into its own snapshots (the second restart restores from a
snapshot the new code wrote) and refuse a resume whose setting does not do
what the old run did (the old code had no reward timeout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import expected_prompts, run_simulated, run_until_crash, small_config

from rollvault.checkpoint_tools.run_history import check_exactly_once, read_run_history
from rollvault.controller.snapshots import resume
from rollvault.durable.bootstrap import read_bootstrap_manifest
from rollvault.durable.compatibility import BootstrapCompatibilityIdentity
from rollvault.durable.errors import IncompatibleRunError
from rollvault.durable.layout import BOOTSTRAP_DIRNAME
from rollvault.durable.snapshot_dirs import committed_snapshot_paths, snapshots_root

SLOW_GATE = ("gate.simulated.latency_per_token_s=0.0005", "rollout_checkpointing.interval_s=0.05")


def _older_identity(config: dict[str, Any]) -> BootstrapCompatibilityIdentity:
    older = {**config, "rollout": dict(config["rollout"]), "reward": dict(config["reward"])}
    del older["rollout"]["prefix_resume"], older["reward"]["timeout_s"]
    return ORIGINAL_IDENTITY(older)


ORIGINAL_IDENTITY = resume.bootstrap_compatibility_identity


def test_a_run_written_before_a_setting_existed_resumes_and_trains_every_prompt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(tmp_path, *SLOW_GATE, "reward.timeout_s=null")
    with monkeypatch.context() as older_code:
        older_code.setattr(resume, "bootstrap_compatibility_identity", _older_identity)
        run_until_crash(config, 2)
    anchor = Path(config.checkpointing.checkpoint_dir) / BOOTSTRAP_DIRNAME
    legacy = read_bootstrap_manifest(anchor).fingerprint
    assert legacy != resume.run_fingerprint(config)

    run_until_crash(config, 5)  # the new code: resumes, then writes snapshots of its own
    source = resume.prepare_checkpoint_dir(config)
    assert source is not None and source.fingerprint == legacy
    # The newest snapshot, the new code's, is the one chosen: it carries the anchor's
    # fingerprint (with this config's own it would be skipped for an older one).
    newest = committed_snapshot_paths(snapshots_root(anchor))[-1]
    assert source.snapshot is not None and source.snapshot.path == newest
    assert source.snapshot.manifest.bootstrap_fingerprint == legacy
    run_simulated(config)
    history = read_run_history(Path(config.logging.log_dir))
    assert len(history.restores) == 2
    assert all(restore.snapshot is not None for restore in history.restores)
    assert check_exactly_once(history, expected_prompts(24, 2)) == []

    timed = small_config(tmp_path, *SLOW_GATE)  # the default reward timeout
    with pytest.raises(IncompatibleRunError, match=r"reward.timeout_s: null -> 300.0"):
        resume.prepare_checkpoint_dir(timed)
