"""The default model and tokenizer: built offline, saved, loaded back through from_pretrained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from grpo_test_helpers import build_model

from rollvault.gates.causal_lm import ModelDirError, load_causal_lm, load_tokenizer
from rollvault.training.model_store import build_default_model, ensure_model_dir
from rollvault.training.tokenizer import DEFAULT_ALPHABET, build_char_tokenizer


def test_save_and_load_round_trip_through_from_pretrained(tmp_path: Path) -> None:
    model, tokenizer = build_model(tmp_path / "model", seed=3)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "model").iterdir()
    }
    fresh = build_default_model(build_char_tokenizer(), seed=3)
    loaded = model.state_dict()
    assert set(loaded) == set(fresh.state_dict())
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    params = sum(p.numel() for p in model.parameters())
    assert 400_000 < params < 600_000
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
    built = build_char_tokenizer()
    text = DEFAULT_ALPHABET + "07+35=42"
    assert tokenizer(text).input_ids == built(text).input_ids
    assert len(set(tokenizer(DEFAULT_ALPHABET).input_ids)) == len(DEFAULT_ALPHABET)
    assert tokenizer.decode(tokenizer("07+35=").input_ids) == "07+35="
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert tokenizer.decode([4, 5, 1], skip_special_tokens=False) == "12<eos>"


def test_an_existing_model_directory_is_loaded_not_rebuilt(tmp_path: Path) -> None:
    path = ensure_model_dir(tmp_path / "model", build_default=True, seed=0)
    weights = path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    # A different seed would build different weights: the directory must win.
    assert ensure_model_dir(path, build_default=True, seed=1) == path
    assert weights.stat().st_mtime_ns == before
    assert not list(tmp_path.glob("tmp_model_*"))


def test_the_same_loader_takes_any_local_model_directory(tmp_path: Path) -> None:
    model, tokenizer = build_model(tmp_path / "a")
    model.save_pretrained(tmp_path / "user_model")
    tokenizer.save_pretrained(tmp_path / "user_model")
    again = load_causal_lm(tmp_path / "user_model")
    assert type(again) is type(model)
    assert load_tokenizer(tmp_path / "user_model").eos_token_id == tokenizer.eos_token_id


def test_missing_or_foreign_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="build_default"):
        ensure_model_dir(tmp_path / "absent", build_default=False, seed=0)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(ModelDirError, match="holds no model"):
        ensure_model_dir(foreign, build_default=True, seed=0)
    with pytest.raises(ModelDirError, match="no config.json"):
        load_causal_lm(foreign)


def test_a_leftover_temporary_build_is_replaced(tmp_path: Path) -> None:
    leftover = tmp_path / "tmp_model_model"
    leftover.mkdir()
    (leftover / "config.json").write_text("{half written")
    model, _ = build_model(tmp_path / "model")
    assert not leftover.exists()
    assert model.config.hidden_size == 128


def test_tokenizer_alphabet_is_checked() -> None:
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer("0120")
    with pytest.raises(ValueError, match="empty"):
        build_char_tokenizer("")
