"""Weight bytes are a safetensors file both ways, loaded strictly, with one copy each way."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from rollvault.gates.weight_bytes import WeightBytesError, load_state_bytes, state_dict_bytes
from rollvault.training.model_store import build_default_model
from rollvault.training.tokenizer import build_char_tokenizer


def _model(seed: int) -> torch.nn.Module:
    return build_default_model(build_char_tokenizer(), seed=seed)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_bytes_load_in_safetensors_and_safetensors_bytes_load_here() -> None:
    source, target = _model(1), _model(2)
    data = state_dict_bytes(source.state_dict())  # tied embeddings share memory: written twice
    read = load(data)
    assert read.keys() == source.state_dict().keys()
    for name, tensor in source.state_dict().items():
        assert torch.equal(read[name], tensor), name
    load_state_bytes(target, data)
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    # And the other way: what safetensors writes loads here too.
    other = _model(3)
    load_state_bytes(target, save(_state(other)))
    for name, tensor in other.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name


def test_bfloat16_round_trips() -> None:
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(4)}
    read = load(state_dict_bytes(tensors))
    assert read["a"].dtype == torch.bfloat16 and torch.equal(read["a"], tensors["a"])
    assert torch.equal(read["b"], tensors["b"])


def test_weights_that_do_not_fit_are_refused_by_name_and_change_nothing() -> None:
    target = _model(2)
    before = _state(target)
    good = _state(_model(1))
    name = "model.norm.weight"
    cases = {
        "missing": {k: v for k, v in good.items() if k != name},
        "unexpected": {**good, "extra.weight": torch.zeros(2)},
        name: {**good, name: good[name][:-1].clone()},  # wrong shape
    }
    for expected, state in cases.items():
        with pytest.raises(WeightBytesError, match=expected):
            load_state_bytes(target, save(state))
    wrong_dtype = {**good, name: good[name].double()}
    with pytest.raises(WeightBytesError, match=name):
        load_state_bytes(target, save(wrong_dtype))
    data = save(good)
    for broken in (data[:4], data[:-1], data + b"\x00"):
        with pytest.raises(WeightBytesError, match="weights"):
            load_state_bytes(target, broken)
    for key, tensor in target.state_dict().items():
        assert torch.equal(tensor, before[key]), key
