"""The YAML parsing of config files and override values: safe, with YAML 1.2 floats and bools."""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load_yaml"]


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-6`` as a float (YAML 1.2), not a string, and takes
    only ``true``/``false`` as bools (YAML 1.2): ``rollout.prefix_resume=off`` is the string
    ``off``, not False."""


# Copied per class by add_implicit_resolver's first call, so SafeLoader itself is unchanged.
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)

_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """Parse ``text`` with the safe config loader; raises ``yaml.YAMLError`` if malformed."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
