"""The YAML loader of config files and override values."""

from __future__ import annotations

import re

import yaml  # type: ignore[import-untyped]  # no stubs without types-PyYAML


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-6`` as a float (YAML 1.2), not a string."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
