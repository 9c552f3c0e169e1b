"""Command-line overrides: ``a.b.c=value``, checked against the schema and applied."""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped]  # no stubs without types-PyYAML

from rollvault.config.dotpaths import _leaf_type
from rollvault.config.errors import ConfigError
from rollvault.config.yaml_loader import _ConfigLoader

__all__ = ["parse_override"]


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b.c=value`` into the checked dotpath and the YAML-scalar value."""
    dotpath, sep, raw = text.partition("=")
    dotpath = dotpath.strip()
    if not sep or not dotpath:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    if any(not part for part in dotpath.split(".")):
        raise ConfigError(f"override {text!r}: empty segment in key {dotpath!r}")
    try:
        value = yaml.load(raw, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    if isinstance(value, dict | list):
        raise ConfigError(
            f"override {text!r}: value must be a scalar, got {type(value).__name__}; "
            "override one leaf key at a time"
        )
    _leaf_type(dotpath, f"override {text!r}")
    return dotpath, value


def _apply_override(data: dict[str, Any], dotpath: str, value: Any, text: str) -> None:
    *parents, leaf = dotpath.split(".")
    node = data
    for depth, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            section = ".".join(parents[: depth + 1])
            raise ConfigError(
                f"override {text!r}: {section} must be a mapping, got {type(child).__name__}"
            )
        node = child
    node[leaf] = value
