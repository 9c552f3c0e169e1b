"""The error every run config problem raises."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The run config is invalid; the message names the offending dotpath(s)."""
