"""A policy's weights as safetensors bytes, written and loaded with one copy each way.

Every weight version travels from the trainer to the generation worker as the
bytes of a safetensors file (:mod:`rollvault.gates.worker_protocol`). Writing
them with ``safetensors.torch.save`` cost a clone of every tensor (it refuses
tensors that share memory, such as tied embeddings), a copy into its buffer
and a copy into the returned bytes; loading them with ``safetensors.torch.load``
and ``load_state_dict`` a copy per tensor into new tensors, then the copy into
the parameters. Here :func:`state_dict_bytes` copies each tensor once into the
output, and :func:`load_state_bytes` copies each tensor once from the input
into the model's own tensors. The bytes are a valid safetensors file (any
safetensors reader loads them; a test holds both directions).

Loading is strict, as ``load_state_dict(strict=True)`` is: the names must be
the model's state dict's, each with its dtype and shape, and the header must
describe the buffer exactly; anything else raises :class:`WeightBytesError`
naming the tensor.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Mapping

import torch

__all__ = ["WeightBytesError", "load_state_bytes", "state_dict_bytes"]

_DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_HEADER_SIZE = struct.Struct("<Q")


class WeightBytesError(ValueError):
    """Weight bytes that do not fit the model (names, dtypes, shapes) or are malformed."""


def state_dict_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """``state`` as safetensors bytes (tensors that share memory are written each in full)."""
    header: dict[str, object] = {}
    tensors = []
    offset = 0
    for name, tensor in state.items():
        data = tensor.detach().contiguous()  # a no-op for parameters
        if data.dtype not in _DTYPE_NAMES:
            raise WeightBytesError(f"tensor {name!r}: dtype {data.dtype} is not supported")
        size = data.numel() * data.element_size()
        header[name] = {
            "dtype": _DTYPE_NAMES[data.dtype],
            "shape": list(data.shape),
            "data_offsets": [offset, offset + size],
        }
        tensors.append((offset, size, data))
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads its header to 8 bytes
    start = _HEADER_SIZE.size + len(encoded)
    out = bytearray(start + offset)
    _HEADER_SIZE.pack_into(out, 0, len(encoded))
    out[_HEADER_SIZE.size : start] = encoded
    if offset:
        target = torch.frombuffer(out, dtype=torch.uint8)
        for begin, size, data in tensors:
            if size:
                target[start + begin : start + begin + size].copy_(_as_bytes(data))
    return bytes(out)


def load_state_bytes(model: torch.nn.Module, data: bytes) -> None:
    """Copy the tensors of ``data`` (safetensors bytes) into ``model``'s parameters and buffers.

    Strict: ``data`` holds exactly the model's state dict names, each with the
    model's dtype and shape. Nothing of the model changes when a check fails.
    """
    specs, start = _read_header(data)
    state = model.state_dict(keep_vars=True)
    missing = sorted(set(state) - set(specs))
    unexpected = sorted(set(specs) - set(state))
    if missing or unexpected:
        raise WeightBytesError(
            f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    sources = []
    for name, (dtype, shape, begin, end) in specs.items():
        target = state[name]
        if dtype != target.dtype or shape != list(target.shape):
            raise WeightBytesError(
                f"tensor {name!r}: weights have {dtype} {shape}, the model "
                f"{target.dtype} {list(target.shape)}"
            )
        sources.append((target, begin, end))
    with warnings.catch_warnings():
        # torch warns that bytes are read-only: they are only read from here.
        warnings.simplefilter("ignore", UserWarning)
        source = torch.frombuffer(data, dtype=torch.uint8)
    with torch.no_grad():
        for target, begin, end in sources:
            if end > begin:
                _as_bytes(target).copy_(source[start + begin : start + end])


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of ``tensor``'s memory (which must be contiguous)."""
    flat = tensor.detach()
    if not flat.is_contiguous():
        raise WeightBytesError(f"a tensor of shape {list(flat.shape)} is not contiguous")
    return flat.reshape(-1).view(torch.uint8)


def _read_header(data: bytes) -> tuple[dict[str, tuple[torch.dtype, list[int], int, int]], int]:
    """Each tensor's (dtype, shape, begin, end) and where the data starts; the byte ranges
    must tile the data exactly, as safetensors requires."""
    if len(data) < _HEADER_SIZE.size:
        raise WeightBytesError(f"weights: {len(data)} bytes, too short for a safetensors header")
    (length,) = _HEADER_SIZE.unpack_from(data, 0)
    start = _HEADER_SIZE.size + length
    if start > len(data):
        raise WeightBytesError(f"weights: header of {length} bytes runs past {len(data)} bytes")
    try:
        header = json.loads(bytes(data[_HEADER_SIZE.size : start]))
    except ValueError as exc:
        raise WeightBytesError(f"weights: the header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightBytesError("weights: the header is not a JSON object")
    header.pop("__metadata__", None)
    specs: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
    for name, entry in header.items():
        specs[name] = _spec(name, entry)
    covered = 0
    for _, _, begin, end in sorted(specs.values(), key=lambda spec: (spec[2], spec[3])):
        if begin != covered:
            raise WeightBytesError(f"weights: the tensors' byte ranges leave a gap at {covered}")
        covered = end
    if start + covered != len(data):
        raise WeightBytesError(
            f"weights: the tensors cover {covered} bytes, the data is {len(data) - start}"
        )
    return specs, start


def _spec(name: str, entry: object) -> tuple[torch.dtype, list[int], int, int]:
    if not isinstance(entry, dict):
        raise WeightBytesError(f"tensor {name!r}: its header entry is not an object")
    dtype = _DTYPES.get(str(entry.get("dtype")))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if dtype is None:
        raise WeightBytesError(f"tensor {name!r}: dtype {entry.get('dtype')!r} is not supported")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WeightBytesError(f"tensor {name!r}: bad shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise WeightBytesError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    numel = 1
    for dim in shape:
        numel *= dim
    size = numel * torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != size:
        raise WeightBytesError(
            f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for {dtype} {shape} ({size})"
        )
    return dtype, list(shape), offsets[0], offsets[1]
