"""Importing the function ``reward.function`` names, and checking it can be called.

A module is imported with :func:`importlib.import_module`; a file is loaded
with :func:`importlib.util.spec_from_file_location` under a module name
derived from its absolute path (``rollvault_reward_file_<digest>``), so the
same file always gets the same name and two files never share one. The file's
directory is not put on ``sys.path``: a file that imports a helper beside it
should be a module (``module:function``) on ``PYTHONPATH`` instead.

The function must accept ``(response_text, sample)``
(``inspect.signature(...).bind``); ``async def`` functions (and objects with
an ``async def __call__``) are awaited by the environment, any other is run in
a worker thread. Every refusal is a :class:`~rollvault.config.errors.ConfigError`
naming ``reward.function``, the module or file, and the attribute.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rollvault.config.schema import RewardConfig
from rollvault.rewards.builtins import builtin_reward_function
from rollvault.rewards.errors import (
    RewardFunctionAttributeError,
    RewardFunctionImportError,
    RewardFunctionNotCallableError,
    RewardFunctionSignatureError,
    RewardFunctionSpecError,
)
from rollvault.rewards.spec import RewardFunctionKind, RewardFunctionSpec, parse_reward_function

__all__ = ["LoadedRewardFunction", "file_module_name", "load_reward_function"]

_FILE_MODULE_PREFIX = "rollvault_reward_file_"


@dataclass(frozen=True)
class LoadedRewardFunction:
    """A reward function ready to call, and what it is."""

    spec: RewardFunctionSpec
    function: Callable[..., Any]
    is_async: bool
    """Call and await it; otherwise it runs in a worker thread (a built-in runs inline)."""

    @property
    def is_builtin(self) -> bool:
        return self.spec.kind is RewardFunctionKind.BUILTIN


def load_reward_function(config: RewardConfig) -> LoadedRewardFunction:
    """The function ``config.function`` names, imported and checked (see the module docstring)."""
    if config.function is None:
        raise RewardFunctionSpecError("reward.function is not set")
    spec = parse_reward_function(config.function)
    if spec.kind is RewardFunctionKind.BUILTIN:
        try:
            function = builtin_reward_function(spec.target, format_regex=config.format_regex)
        except ValueError as error:
            raise RewardFunctionSpecError(f"{spec.setting}: {error}") from error
        return LoadedRewardFunction(spec=spec, function=function, is_async=False)
    module = _import_file(spec) if spec.kind is RewardFunctionKind.FILE else _import_module(spec)
    function = _attribute(spec, module)
    _check_signature(spec, function)
    return LoadedRewardFunction(spec=spec, function=function, is_async=_is_async(function))


def file_module_name(spec: RewardFunctionSpec) -> str:
    """The module name a ``path.py:function`` file is loaded under: stable per absolute path."""
    digest = hashlib.sha256(str(spec.file_path()).encode()).hexdigest()[:16]
    return f"{_FILE_MODULE_PREFIX}{digest}"


def _where(spec: RewardFunctionSpec) -> str:
    if spec.kind is RewardFunctionKind.FILE:
        return f"file {spec.file_path()}"
    return f"module {spec.target!r}"


def _import_module(spec: RewardFunctionSpec) -> ModuleType:
    try:
        return importlib.import_module(spec.target)
    except ModuleNotFoundError as error:
        raise RewardFunctionImportError(
            f"{spec.setting}: cannot import module {spec.target!r}: {_described(error)} "
            "(install it or put its directory on PYTHONPATH; a file can be given as "
            "path/to/file.py:function)"
        ) from error
    # User code runs on import: whatever it raises means it cannot be used.
    except Exception as error:
        raise RewardFunctionImportError(
            f"{spec.setting}: importing module {spec.target!r} raised {_described(error)}"
        ) from error


def _import_file(spec: RewardFunctionSpec) -> ModuleType:
    path = spec.file_path()
    if not path.is_file():
        raise RewardFunctionImportError(
            f"{spec.setting}: file {path} does not exist or is not a file "
            "(a relative path is taken from the current directory)"
        )
    name = file_module_name(spec)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise RewardFunctionImportError(f"{spec.setting}: cannot load file {path} as Python")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before it runs, as a normal import does (dataclasses, pickling and
    # typing look a module up by name); a later load of the same file replaces it.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    # User code runs on import: whatever it raises means it cannot be used.
    except Exception as error:
        del sys.modules[name]
        raise RewardFunctionImportError(
            f"{spec.setting}: loading file {path} raised {_described(error)}"
        ) from error
    return module


def _attribute(spec: RewardFunctionSpec, module: ModuleType) -> Callable[..., Any]:
    if not hasattr(module, spec.attribute):
        message = f"{spec.setting}: {_where(spec)} has no attribute {spec.attribute!r}"
        public = [name for name in dir(module) if not name.startswith("_")]
        close = difflib.get_close_matches(spec.attribute, public, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise RewardFunctionAttributeError(message)
    function = getattr(module, spec.attribute)
    if not callable(function):
        raise RewardFunctionNotCallableError(
            f"{spec.setting}: {spec.attribute!r} in {_where(spec)} is a "
            f"{type(function).__name__}, not a function"
        )
    return function


def _check_signature(spec: RewardFunctionSpec, function: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # no signature to read (some extension callables): it is tried when called
    try:
        signature.bind("response_text", {})
    except TypeError as error:
        raise RewardFunctionSignatureError(
            f"{spec.setting}: {spec.attribute}{signature} in {_where(spec)} cannot be called "
            f"as {spec.attribute}(response_text, sample): {error}"
        ) from error


def _is_async(function: Callable[..., Any]) -> bool:
    call = getattr(function, "__call__", None)  # noqa: B004 - an async __call__ counts too
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
