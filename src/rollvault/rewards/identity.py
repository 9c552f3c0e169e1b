"""A reward function's identity: what the run's fingerprint holds of it.

The identity is the setting (``reward.function``, already in the config),
the source file it resolves to, and the SHA-256 of that file's bytes. The
fingerprint takes the setting and the digest (as
``reward.function_sha256``), not the file's location: like ``model.files``,
a moved checkout with the same code resumes, and changed code at the same
path is refused. For a built-in the file is the built-ins' module, so a
rollvault release that changes them refuses to resume a run scored by the
old ones.

It is computed without running user code where Python allows it: a file is
only read; a module is located with :func:`importlib.util.find_spec`, which
imports its parent packages (``my_pkg`` of ``my_pkg.rewards``) but not the
module itself. Only the one source file is digested: a change in a helper it
imports escapes the fingerprint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import msgspec

from rollvault.durable.file_digests import sha256_file
from rollvault.rewards import builtins as builtins_module
from rollvault.rewards.errors import RewardFunctionImportError
from rollvault.rewards.spec import RewardFunctionKind, RewardFunctionSpec, parse_reward_function

__all__ = ["RewardFunctionIdentity", "reward_function_identity", "source_file"]


class RewardFunctionIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What a run's reward function is, for its fingerprint."""

    function: str
    """The setting, as ``reward.function`` gives it."""
    kind: RewardFunctionKind
    source: str
    """The absolute path of the source file the setting resolves to."""
    source_sha256: str
    """SHA-256 (hex) of that file's bytes."""


def reward_function_identity(function: str) -> RewardFunctionIdentity:
    """The identity of ``reward.function=function``; refused like loading it would be."""
    spec = parse_reward_function(function)
    path = source_file(spec)
    try:
        digest = sha256_file(path)
    except OSError as error:
        raise RewardFunctionImportError(
            f"{spec.setting}: cannot read its source file {path}: {error}"
        ) from error
    return RewardFunctionIdentity(
        function=function, kind=spec.kind, source=str(path), source_sha256=digest
    )


def source_file(spec: RewardFunctionSpec) -> Path:
    """The file ``spec`` resolves to, found without importing the module itself."""
    if spec.kind is RewardFunctionKind.BUILTIN:
        return Path(builtins_module.__file__).absolute()
    if spec.kind is RewardFunctionKind.FILE:
        return spec.file_path()
    try:
        found = importlib.util.find_spec(spec.target)
    # find_spec imports the parent packages: user code, whatever it raises.
    except Exception as error:
        raise RewardFunctionImportError(
            f"{spec.setting}: cannot locate module {spec.target!r}: {type(error).__name__}: {error}"
        ) from error
    if found is None:
        raise RewardFunctionImportError(
            f"{spec.setting}: cannot locate module {spec.target!r} (install it or put its "
            "directory on PYTHONPATH)"
        )
    if not found.has_location or found.origin is None:
        raise RewardFunctionImportError(
            f"{spec.setting}: module {spec.target!r} has no source file to digest "
            f"(origin {found.origin!r})"
        )
    return Path(found.origin).absolute()
