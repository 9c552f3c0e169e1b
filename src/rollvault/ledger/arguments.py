"""Checks of the plain arguments of ledger calls.

Each returns the value (normalised where that matters for persistence, e.g.
an int reward becomes a float) or raises
:class:`~rollvault.ledger.errors.InvalidLedgerInputError` naming the
argument and what it is about.
"""

from __future__ import annotations

import math

from rollvault.ledger.errors import InvalidLedgerInputError


def require_str(value: object, *, name: str, where: str) -> str:
    """A non-empty str."""
    if not isinstance(value, str) or not value:
        raise InvalidLedgerInputError(f"{where}: {name} must be a non-empty str, got {value!r}")
    return value


def require_optional_str(value: object, *, name: str, where: str) -> str | None:
    """None or a str."""
    if value is not None and not isinstance(value, str):
        raise InvalidLedgerInputError(f"{where}: {name} must be a str or None, got {value!r}")
    return value


def require_int(value: object, *, name: str, where: str, minimum: int = 0) -> int:
    """An int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidLedgerInputError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def require_optional_int(value: object, *, name: str, where: str, minimum: int = 0) -> int | None:
    """None or an int (not a bool) of at least ``minimum``."""
    if value is None:
        return None
    return require_int(value, name=name, where=where, minimum=minimum)


def require_bool(value: object, *, name: str, where: str) -> bool:
    """A bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidLedgerInputError(f"{where}: {name} must be a bool, got {value!r}")
    return value


def require_finite_float(value: object, *, name: str, where: str) -> float:
    """A finite real number, as a float (JSON has no NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidLedgerInputError(
            f"{where}: {name} must be a finite number, got {value!r} (mask the sample "
            "instead of recording a non-finite reward)"
        )
    return float(value)
