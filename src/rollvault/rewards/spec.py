"""Parsing ``reward.function``: which function a run scores with, before anything is imported.

Three forms:

- a built-in name: ``exact_match``, ``numeric_match`` or ``regex_format``
  (see :mod:`rollvault.rewards.builtins`);
- ``module:function``: an importable module (installed, or on ``PYTHONPATH``)
  and a function in it, e.g. ``my_pkg.rewards:score``;
- ``path.py:function``: a Python file, absolute or relative to the current
  directory, and a function in it, e.g. ``rewards/gsm8k.py:score``. The part
  before the last ``:`` is a file when it ends in ``.py`` or holds a ``/``.

Parsing only reads the string; :mod:`rollvault.rewards.loading` imports.
"""

from __future__ import annotations

import difflib
import enum
from pathlib import Path
from typing import Final

import msgspec

from rollvault.rewards.errors import RewardFunctionSpecError

__all__ = [
    "BUILTIN_REWARD_FUNCTIONS",
    "REWARD_FUNCTION_SETTING",
    "RewardFunctionKind",
    "RewardFunctionSpec",
    "parse_reward_function",
]

REWARD_FUNCTION_SETTING: Final = "reward.function"
"""The dotpath every message about the function names."""

BUILTIN_REWARD_FUNCTIONS: Final = ("exact_match", "numeric_match", "regex_format")
"""The built-in functions, by the name ``reward.function`` gives them."""

_FORMS: Final = (
    f"a built-in ({', '.join(BUILTIN_REWARD_FUNCTIONS)}), module:function "
    "(e.g. my_pkg.rewards:score) or path.py:function (e.g. rewards.py:score)"
)


class RewardFunctionKind(enum.StrEnum):
    """Where a reward function comes from."""

    BUILTIN = "builtin"
    MODULE = "module"
    FILE = "file"


class RewardFunctionSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``reward.function``."""

    text: str
    """The setting as given."""
    kind: RewardFunctionKind
    target: str
    """The built-in's name, the dotted module name, or the file path as given."""
    attribute: str
    """The function's name in the module or file (for a built-in: its name)."""

    @property
    def setting(self) -> str:
        """``reward.function='...'``, how every message names the setting."""
        return f"{REWARD_FUNCTION_SETTING}={self.text!r}"

    def file_path(self) -> Path:
        """The file of a ``path.py:function`` spec, made absolute against the current directory."""
        if self.kind is not RewardFunctionKind.FILE:
            raise ValueError(f"{self.setting} names a {self.kind.value}, not a file")
        return Path(self.target).expanduser().absolute()


def parse_reward_function(text: str) -> RewardFunctionSpec:
    """Parse ``reward.function``; :class:`RewardFunctionSpecError` says what is wrong."""
    setting = f"{REWARD_FUNCTION_SETTING}={text!r}"
    if not text.strip():
        raise RewardFunctionSpecError(f"{setting} is empty; give {_FORMS}")
    target, colon, attribute = text.rpartition(":")
    if not colon:
        return _builtin(text, setting)
    if not target:
        raise RewardFunctionSpecError(f"{setting} has nothing before ':'; give {_FORMS}")
    if not attribute.isidentifier():
        raise RewardFunctionSpecError(
            f"{setting}: the function name after the last ':' ({attribute!r}) is not a "
            f"Python identifier; give {_FORMS}"
        )
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _file(text, setting, target, attribute)
    if not all(part.isidentifier() for part in target.split(".")):
        raise RewardFunctionSpecError(
            f"{setting}: {target!r} is neither a dotted module name nor a path to a .py "
            f"file; give {_FORMS}"
        )
    return RewardFunctionSpec(
        text=text, kind=RewardFunctionKind.MODULE, target=target, attribute=attribute
    )


def _builtin(text: str, setting: str) -> RewardFunctionSpec:
    if text in BUILTIN_REWARD_FUNCTIONS:
        return RewardFunctionSpec(
            text=text, kind=RewardFunctionKind.BUILTIN, target=text, attribute=text
        )
    message = f"{setting} names no built-in reward function and has no ':'; give {_FORMS}"
    close = difflib.get_close_matches(text, BUILTIN_REWARD_FUNCTIONS, n=1)
    if close:
        message += f"; did you mean {close[0]!r}?"
    raise RewardFunctionSpecError(message)


def _file(text: str, setting: str, target: str, attribute: str) -> RewardFunctionSpec:
    if not target.endswith(".py"):
        raise RewardFunctionSpecError(
            f"{setting}: the file {target!r} must be a Python file ending in .py; give {_FORMS}"
        )
    return RewardFunctionSpec(
        text=text, kind=RewardFunctionKind.FILE, target=target, attribute=attribute
    )
