"""The GRPO trainer's checkpoint files: safetensors for tensors, JSON for the rest.

A trainer checkpoint directory holds

- ``model.safetensors``: the policy's state dict;
- ``reference.safetensors``: the frozen reference policy, when KL is on;
- ``optimizer.safetensors``: every per-parameter optimizer tensor, named
  ``state.<param index>.<name>``, plus the torch CPU RNG state (``rng.torch_cpu``);
- ``trainer_state.json``: schema version, steps trained, and the optimizer's
  parameter groups (learning rate, betas, ...).

No pickle anywhere: loading never executes code from the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rollvault.controller.loop.trainer import TrainerCheckpointError
from rollvault.durable.io_errors import os_error_in

__all__ = [
    "MODEL_FILENAME",
    "OPTIMIZER_FILENAME",
    "REFERENCE_FILENAME",
    "STATE_FILENAME",
    "TRAINER_FILES_SCHEMA_VERSION",
    "TrainerStateFile",
    "read_optimizer",
    "read_state_file",
    "read_tensors",
    "write_optimizer",
    "write_state_file",
    "write_tensors",
]

TRAINER_FILES_SCHEMA_VERSION = 1
MODEL_FILENAME = "model.safetensors"
REFERENCE_FILENAME = "reference.safetensors"
OPTIMIZER_FILENAME = "optimizer.safetensors"
STATE_FILENAME = "trainer_state.json"
_RNG_KEY = "rng.torch_cpu"


class TrainerStateFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``trainer_state.json``."""

    schema_version: int
    steps_trained: int
    param_groups: list[dict[str, Any]]
    """The optimizer's parameter groups as JSON (tuples became lists)."""
    has_reference: bool


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Save detached, contiguous copies (tied weights become separate tensors).

    A failed write (disk full, I/O error) raises ``OSError``, which the
    checkpointer reports as a failed trainer checkpoint.
    """
    copies = {name: t.detach().clone().contiguous() for name, t in tensors.items()}
    try:
        save_file(copies, str(path))
    except SafetensorError as exc:
        os_error = os_error_in(exc, path)
        if os_error is None:
            raise
        raise os_error from exc


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise TrainerCheckpointError(f"cannot read {path}: {exc}") from exc


def write_optimizer(path: Path, state: dict[int, dict[str, Any]]) -> None:
    tensors = {
        f"state.{index}.{name}": value
        for index, entries in state.items()
        for name, value in entries.items()
    }
    tensors[_RNG_KEY] = torch.get_rng_state()
    write_tensors(path, tensors)


def read_optimizer(path: Path) -> tuple[dict[int, dict[str, torch.Tensor]], torch.Tensor]:
    """The per-parameter optimizer state and the saved torch CPU RNG state."""
    tensors = read_tensors(path)
    rng = tensors.pop(_RNG_KEY, None)
    if rng is None:
        raise TrainerCheckpointError(f"{path}: no {_RNG_KEY} tensor")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        prefix, index, name = (key.split(".", 2) + ["", ""])[:3]
        if prefix != "state" or not index.isdigit() or not name:
            raise TrainerCheckpointError(f"{path}: unexpected tensor {key!r}")
        state.setdefault(int(index), {})[name] = value
    return state, rng


def write_state_file(path: Path, state: TrainerStateFile) -> None:
    path.write_bytes(msgspec.json.encode(state))


def read_state_file(path: Path) -> TrainerStateFile:
    try:
        state = msgspec.json.decode(path.read_bytes(), type=TrainerStateFile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TrainerCheckpointError(f"cannot load {path}: {exc}") from exc
    if state.schema_version != TRAINER_FILES_SCHEMA_VERSION:
        raise TrainerCheckpointError(
            f"{path}: unsupported schema_version {state.schema_version} "
            f"(this version reads {TRAINER_FILES_SCHEMA_VERSION})"
        )
    return state
