"""Command-line overrides: ``a.b.c=value``, checked against the schema and applied."""

from __future__ import annotations

from typing import Any

import yaml

from rollvault.config.dotpaths import leaf_type
from rollvault.config.errors import ConfigError
from rollvault.config.yaml_loader import load_yaml

__all__ = ["apply_override", "parse_override"]


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b.c=value`` into the checked dotpath and the YAML-scalar value."""
    dotpath, sep, raw = text.partition("=")
    dotpath = dotpath.strip()
    if not sep or not dotpath:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    if any(not part for part in dotpath.split(".")):
        raise ConfigError(f"override {text!r}: empty segment in key {dotpath!r}")
    try:
        value = load_yaml(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    if isinstance(value, dict | list):
        raise ConfigError(
            f"override {text!r}: value must be a scalar, got {type(value).__name__}; "
            "override one leaf key at a time"
        )
    leaf_type(dotpath, f"override {text!r}")
    return dotpath, value


def apply_override(data: dict[str, Any], dotpath: str, value: Any, text: str) -> None:
    """Set the leaf ``dotpath`` of ``data`` to ``value``, creating sections on the way.

    ``text`` is the override as given, for the message when a section is not a mapping.
    """
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
