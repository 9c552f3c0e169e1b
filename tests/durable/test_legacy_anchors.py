"""Anchors an older rollvault wrote: settings added since, paths declared operational since.

An anchor lacking a setting that did not exist when it was written is read as
holding the setting's legacy value (the one that does what that run did), so
the run resumes when this config holds that value and is refused, naming the
value that resumes it, when it does not. A path declared operational since is
ignored on both sides; a path no longer operational is a refusal.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rollvault.durable.bootstrap import (
    BootstrapAnchor,
    ensure_bootstrap_anchor,
    open_bootstrap_anchor,
    read_bootstrap_manifest,
    validate_bootstrap_anchor,
)
from rollvault.durable.compatibility import (
    BootstrapCompatibilityIdentity,
    bootstrap_compatibility_identity,
)
from rollvault.durable.errors import IncompatibleRunError

CONFIG: dict[str, Any] = {
    "seed": 3,
    "rollout": {"prefix_resume": "off", "prefix_resume_tokens": 16, "max_inflight_prompts": 4},
    "reward": {"timeout_s": None, "overlong_penalty": 0.5},
}


def _without(config: dict[str, Any], *dotpaths: str) -> dict[str, Any]:
    config = copy.deepcopy(config)
    for dotpath in dotpaths:
        *parents, key = dotpath.split(".")
        section = config
        for name in parents:
            section = section[name]
        del section[key]
    return config


def _legacy_anchor(tmp_path: Path, identity: BootstrapCompatibilityIdentity) -> Path:
    return ensure_bootstrap_anchor(tmp_path / "ckpt", identity=identity)


def test_an_anchor_without_settings_added_since_resumes_at_their_legacy_values(
    tmp_path: Path,
) -> None:
    old = _without(
        CONFIG, "rollout.prefix_resume", "rollout.prefix_resume_tokens", "reward.timeout_s"
    )
    anchor = _legacy_anchor(tmp_path, bootstrap_compatibility_identity(old))
    current = bootstrap_compatibility_identity(CONFIG)
    legacy = read_bootstrap_manifest(anchor).fingerprint
    assert legacy != current.fingerprint()
    ensure_bootstrap_anchor(anchor.parent, identity=current)  # passes
    # The run goes on under the anchor's fingerprint, which its snapshots carry.
    assert validate_bootstrap_anchor(anchor, identity=current) == legacy
    assert open_bootstrap_anchor(anchor.parent, identity=current) == BootstrapAnchor(anchor, legacy)


def test_a_setting_added_since_at_another_value_names_the_value_that_resumes(
    tmp_path: Path,
) -> None:
    old = _without(CONFIG, "rollout.prefix_resume", "reward.timeout_s")
    anchor = _legacy_anchor(tmp_path, bootstrap_compatibility_identity(old))
    changed = copy.deepcopy(CONFIG)
    changed["rollout"]["prefix_resume"] = "keep"
    changed["reward"]["timeout_s"] = 300.0
    with pytest.raises(IncompatibleRunError) as info:
        ensure_bootstrap_anchor(anchor.parent, identity=bootstrap_compatibility_identity(changed))
    assert info.value.differences == [
        "reward.timeout_s: null -> 300.0",
        'rollout.prefix_resume: "off" -> "keep"',
    ]


def test_a_setting_without_a_legacy_value_is_still_refused_as_missing(tmp_path: Path) -> None:
    old = _without(CONFIG, "rollout.max_inflight_prompts", "seed")
    anchor = _legacy_anchor(tmp_path, bootstrap_compatibility_identity(old))
    with pytest.raises(IncompatibleRunError) as info:
        ensure_bootstrap_anchor(anchor.parent, identity=bootstrap_compatibility_identity(CONFIG))
    # max_inflight_prompts is operational (excluded on both sides); seed is not, and has
    # no legacy value: the anchor is refused, naming it.
    assert info.value.differences == ["seed: <missing> -> 3"]


def test_a_path_declared_operational_since_is_ignored(tmp_path: Path) -> None:
    current = bootstrap_compatibility_identity(CONFIG)
    newly = "rollout.max_inflight_prompts"
    assert newly in current.excluded_paths
    older = BootstrapCompatibilityIdentity(
        schema_version=current.schema_version,
        excluded_paths=tuple(p for p in current.excluded_paths if p != newly),
        config={**current.config, "rollout": {**CONFIG["rollout"], "max_inflight_prompts": 9}},
    )
    anchor = _legacy_anchor(tmp_path, older)
    ensure_bootstrap_anchor(anchor.parent, identity=current)  # passes: 9 vs 4 is operational now


def test_a_path_no_longer_operational_is_refused(tmp_path: Path) -> None:
    current = bootstrap_compatibility_identity(CONFIG)
    older = BootstrapCompatibilityIdentity(
        schema_version=current.schema_version,
        excluded_paths=tuple(sorted((*current.excluded_paths, "seed"))),
        config={key: value for key, value in current.config.items() if key != "seed"},
    )
    anchor = _legacy_anchor(tmp_path, older)
    with pytest.raises(IncompatibleRunError) as info:
        ensure_bootstrap_anchor(anchor.parent, identity=current)
    assert info.value.differences[0].startswith("excluded operational paths: ")
    assert "seed: <missing> -> 3" in info.value.differences
