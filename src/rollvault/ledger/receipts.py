"""The Gate receipt: the token-free result of one sealed attempt.

A receipt is a small JSON-safe dict. Its one documented shape::

    {
        "gate_rollout_id": "<group_id>_g<i>_a<attempt uuid hex>",   # required
        "staging_keys": ["<key of model call 0>", "<key of call 1>", ...],  # required
        "row_digests": [{"length": 812, "digest": "<hex>"}, ...],   # optional
        "reward": 1.0,                                              # optional
        "weight_version": 3,                                        # optional
        "worker_id": "generation-actor-1",                          # optional
    }

- ``staging_keys``: the data-plane keys of the attempt's token rows in the
  ``rollout_staging`` partition, one per model call (a turn of its episode),
  in call order; a non-empty list of distinct non-empty strings. An attempt
  that continues an interrupted episode lists the committed turns it
  inherited first: their keys name the attempt that generated them.
- ``row_digests``: when present, entry ``k`` describes the row under
  ``staging_keys[k]`` (token count and content digest); the finalizer checks
  the staged rows against them before publishing canonical rows.
- ``reward``: the raw reward as the Gate reported it; when present it must
  equal the ``reward`` passed to the seal.
- ``weight_version``: the policy version that generated the attempt's
  tokens. Optional so that receipts of older versions (which did not record
  it) still load; the rollout pump uses it to keep a ``prompt_group``
  group's siblings on one version.
- ``worker_id``: which generation worker (a Ray actor of the pool gate)
  generated the tokens; for the record only.

No other field is accepted: a receipt is persisted in the ledger sidecar,
whose schema is strict.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec

from rollvault.ledger.errors import InvalidReceiptError

_NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class StagedRowDigest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Size and content digest of one staged token row."""

    length: Annotated[int, msgspec.Meta(ge=0)]
    digest: _NonEmptyStr


class GateReceipt(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True
):
    """Schema of a Gate receipt (see the module docstring)."""

    gate_rollout_id: _NonEmptyStr
    staging_keys: Annotated[list[_NonEmptyStr], msgspec.Meta(min_length=1)]
    row_digests: list[StagedRowDigest] | None = None
    reward: float | None = None
    weight_version: Annotated[int, msgspec.Meta(ge=0)] | None = None
    worker_id: _NonEmptyStr | None = None


def validate_receipt(receipt: object, *, where: str = "receipt") -> GateReceipt:
    """Check ``receipt`` against the documented shape and return it typed.

    ``where`` prefixes the error message (for example the group and sibling
    the receipt belongs to).
    """
    if receipt is None:
        raise InvalidReceiptError(f"{where}: a sealed attempt needs a Gate receipt, got None")
    if not isinstance(receipt, dict):
        raise InvalidReceiptError(
            f"{where}: a Gate receipt must be a dict, got {type(receipt).__name__}"
        )
    try:
        typed = msgspec.convert(receipt, GateReceipt, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidReceiptError(f"{where}: invalid Gate receipt: {exc}") from exc
    check_receipt_semantics(typed, where=where)
    return typed


def check_receipt_semantics(receipt: GateReceipt, *, where: str) -> None:
    """The rules of a receipt that its type alone does not express."""
    keys = receipt.staging_keys
    if len(set(keys)) != len(keys):
        duplicate = next(key for position, key in enumerate(keys) if key in keys[:position])
        raise InvalidReceiptError(
            f"{where}: staging_keys lists {duplicate!r} more than once; each model call "
            "stages its own row"
        )
    if receipt.row_digests is not None and len(receipt.row_digests) != len(keys):
        raise InvalidReceiptError(
            f"{where}: row_digests has {len(receipt.row_digests)} entries for "
            f"{len(keys)} staging_keys; entry k must describe staging_keys[k]"
        )
    if receipt.reward is not None and not math.isfinite(receipt.reward):
        raise InvalidReceiptError(f"{where}: receipt reward must be finite, got {receipt.reward!r}")


def receipt_to_dict(receipt: GateReceipt) -> dict[str, Any]:
    """The receipt as a fresh JSON-safe dict (absent optional fields left out)."""
    result: dict[str, Any] = msgspec.to_builtins(receipt)
    return result


def _receipt_staging_keys(receipt: dict[str, Any] | None) -> list[str]:
    """Validate a terminal Gate receipt and return its ordered staging keys.

    The returned list is a fresh copy: mutating it does not touch ``receipt``.
    """
    return list(validate_receipt(receipt).staging_keys)


def copy_receipt(receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    """A deep copy of a stored receipt (it holds only JSON builtins)."""
    if receipt is None:
        return None
    copied: dict[str, Any] = msgspec.to_builtins(receipt)
    return copied
