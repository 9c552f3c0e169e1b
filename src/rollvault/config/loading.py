"""Loading the run config: one YAML file plus ``a.b.c=value`` overrides.

:func:`load_run_config` reads the YAML, applies the command-line overrides,
then validates strictly: an unknown key is an error naming its full dotpath
and the closest valid key, a wrong type names the dotpath and the expected
type, and cross-field rules name every field involved.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import yaml

from rollvault.config.dotpaths import check_keys, leaf_type
from rollvault.config.errors import ConfigError
from rollvault.config.overrides import apply_override, parse_override
from rollvault.config.rules import validate_run_config
from rollvault.config.schema import RunConfig
from rollvault.config.yaml_loader import load_yaml

__all__ = [
    "config_to_dict",
    "default_config_path",
    "load_run_config",
]


_MSGSPEC_PATH = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_BAD_ENUM_VALUE = re.compile(r"^Invalid enum value '(?P<value>.*)'$", re.DOTALL)


def default_config_path() -> Path:
    """The packaged ``configs/default.yaml``, equal to the Struct defaults."""
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def load_run_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read ``path`` (YAML; ``None`` means all defaults), apply overrides, validate.

    Each override is ``dotted.key=value``; the value is parsed as a YAML scalar.
    Raises :class:`ConfigError` naming the dotpath of whatever is wrong.
    """
    data = _read_yaml(path) if path is not None else {}
    check_keys(data, RunConfig, "", f"config file {path}")
    origins: dict[str, str] = {}
    for override in overrides:
        dotpath, value = parse_override(override)
        apply_override(data, dotpath, value, override)
        origins[dotpath] = f"override {override!r}"
    config = _convert(data, origins, default_origin=f"config file {path}" if path else None)
    validate_run_config(config)
    return config


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """The config as plain builtins (enums as their values), e.g. for the run fingerprint."""
    result = msgspec.to_builtins(config)
    if not isinstance(result, dict):
        raise TypeError(f"config_to_dict expects a RunConfig, got {type(config).__name__}")
    return result


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping at the top level, got {type(data).__name__}"
        )
    return data


def _convert(
    data: dict[str, Any], origins: Mapping[str, str], *, default_origin: str | None
) -> RunConfig:
    try:
        return msgspec.convert(data, type=RunConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe_validation_error(str(exc), origins, default_origin)) from exc


def _describe_validation_error(
    message: str, origins: Mapping[str, str], default_origin: str | None
) -> str:
    """Rewrite msgspec's ``... - at `$.a.b``` as ``a.b: ...`` plus origin and enum choices."""
    match = _MSGSPEC_PATH.match(message)
    if match is None:
        return f"invalid run config: {message}"
    dotpath = match["path"].lstrip(".") or "<top level>"
    described = f"invalid run config: {dotpath}: {match['what']}"
    origin = origins.get(dotpath, default_origin)
    if origin is not None:
        described += f" (from {origin})"
    enum_type = _enum_at(dotpath)
    if enum_type is not None:
        choices = [str(member.value) for member in enum_type]
        described += f" (expected one of: {', '.join(choices)})"
        bad = _BAD_ENUM_VALUE.match(match["what"])
        close = difflib.get_close_matches(bad["value"], choices, n=1) if bad else []
        if close:
            described += f"; did you mean {close[0]!r}?"
    return described


def _enum_at(dotpath: str) -> type[enum.Enum] | None:
    try:
        annotation = leaf_type(dotpath, "<lookup>")
    except ConfigError:
        return None
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    return None
