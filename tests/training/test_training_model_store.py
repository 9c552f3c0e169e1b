"""The default model and tokenizer: built offline, saved, loaded back through from_pretrained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from grpo_test_helpers import build_model

from rollvault.config.schema import RunConfig
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
    with pytest.raises(ValueError, match=r"not ASCII: \['é'\]"):
        build_char_tokenizer("0é")


def test_the_default_alphabet_tokenizes_as_it_always_did(tmp_path: Path) -> None:
    assert RunConfig().model.default_alphabet == DEFAULT_ALPHABET == "0123456789+-*="
    path = ensure_model_dir(
        tmp_path / "model", build_default=True, seed=0, alphabet=RunConfig().model.default_alphabet
    )
    tokenizer = load_tokenizer(path)
    # pad, eos, unk, then one id per character in alphabet order: the ids every run had.
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<eos>", "<unk>"]
    assert tokenizer(DEFAULT_ALPHABET, add_special_tokens=False).input_ids == list(range(3, 17))
    assert len(tokenizer) == 17 and load_causal_lm(path).config.vocab_size == 17
    # Outside the alphabet: dropped, as transformers' Qwen2 tokenizer always did here.
    assert tokenizer("1 a2", add_special_tokens=False).input_ids == [4, 5]
    assert type(tokenizer) is type(build_char_tokenizer())  # built as it loads


def test_loaded_and_built_tokenizers_agree_on_any_text(tmp_path: Path) -> None:
    alphabet = DEFAULT_ALPHABET + " ab\n"
    path = ensure_model_dir(tmp_path / "model", build_default=True, seed=0, alphabet=alphabet)
    loaded, built = load_tokenizer(path), build_char_tokenizer(alphabet)
    for text in ["1 a+b\n", "  ", "xyz 2", "é1", "a<eos>b", "<pad>", "\t\n\n"]:
        ids = built(text, add_special_tokens=False).input_ids
        assert loaded(text, add_special_tokens=False).input_ids == ids, text
        assert loaded.decode(ids, skip_special_tokens=False) == built.decode(
            ids, skip_special_tokens=False
        )


def test_an_alphabet_with_whitespace_round_trips(tmp_path: Path) -> None:
    alphabet = DEFAULT_ALPHABET + " abcdefghijklmnopqrstuvwxyzT.?\n"
    path = ensure_model_dir(tmp_path / "model", build_default=True, seed=0, alphabet=alphabet)
    tokenizer = load_tokenizer(path)
    assert load_causal_lm(path).config.vocab_size == len(tokenizer) == 3 + len(alphabet)
    # The default characters keep their ids; the new ones follow.
    assert tokenizer(DEFAULT_ALPHABET, add_special_tokens=False).input_ids == list(range(3, 17))
    for text in ["Tom has 3 apples. 2+2=4?", "  two  spaces ", "a\nb", " "]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*tokenizer("1 2").input_ids, 1], skip_special_tokens=True) == "1 2"
