"""Errors of the gates that a caller handles without importing a model library."""

from __future__ import annotations

__all__ = ["ModelDirError"]


class ModelDirError(ValueError):
    """A model directory is missing, incomplete, or its tokenizer lacks a needed token."""
