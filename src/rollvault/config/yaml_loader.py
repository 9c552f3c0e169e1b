"""The YAML parsing of config files and override values: safe, with YAML 1.2 floats."""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load_yaml"]


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-6`` as a float (YAML 1.2), not a string."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """Parse ``text`` with the safe config loader; raises ``yaml.YAMLError`` if malformed."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
