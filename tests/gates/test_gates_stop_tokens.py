"""Stop tokens: eos, the generation config's eos ids, the chat turn's end; sampling stops on any."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from chat_model_helpers import IM_END, chatml_model_dir, token_id

from rollvault.gates.causal_lm import load_causal_lm, load_tokenizer
from rollvault.gates.errors import ModelDirError
from rollvault.gates.prompt_rendering import end_of_turn_token_id
from rollvault.gates.sampling import sample_batch
from rollvault.gates.stop_tokens import generation_config_eos_ids, stop_token_ids

torch.set_num_threads(1)


def test_the_union_of_eos_generation_config_and_end_of_turn(tmp_path: Path) -> None:
    path = chatml_model_dir(tmp_path / "m", generation_eos=[5, 1])
    tokenizer = load_tokenizer(path)
    end = token_id(tokenizer, IM_END)
    assert generation_config_eos_ids(path) == [5, 1]
    assert end_of_turn_token_id(tokenizer) == end
    eos = int(tokenizer.eos_token_id)
    assert stop_token_ids(tokenizer, path, end_of_turn_id=None) == [eos, 5]
    assert stop_token_ids(tokenizer, path, end_of_turn_id=end) == [eos, 5, end]
    # An int in the generation config, or no file at all.
    (path / "generation_config.json").write_text('{"eos_token_id": 7, "pad_token_id": 0}')
    assert generation_config_eos_ids(path) == [7]
    (path / "generation_config.json").unlink()
    assert stop_token_ids(tokenizer, path, end_of_turn_id=end) == [eos, end]


def test_a_malformed_generation_config_names_the_file(tmp_path: Path) -> None:
    path = chatml_model_dir(tmp_path / "m")
    (path / "generation_config.json").write_text('{"eos_token_id": "</s>"}')
    with pytest.raises(ModelDirError, match="generation_config.json"):
        generation_config_eos_ids(path)
    (path / "generation_config.json").write_text('{"eos_token_id": [-1]}')
    with pytest.raises(ModelDirError, match="eos_token_id"):
        generation_config_eos_ids(path)


def test_a_row_stops_at_the_first_of_two_stop_tokens(tmp_path: Path) -> None:
    path = chatml_model_dir(tmp_path / "m")
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    eos, pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    prompt = list(tokenizer("12+3=", add_special_tokens=False).input_ids)
    seeds = list(range(48))

    def sample(stops: list[int]) -> list:
        return sample_batch(
            model,
            [prompt] * len(seeds),
            seeds=seeds,
            max_new_tokens=6,
            temperature=1.0,
            stop_token_ids=stops,
            pad_token_id=pad,
        )

    # The second stop token: the commonest first token the model draws here.
    first = Counter(s.token_ids[0] for s in sample([eos]) if s.token_ids[0] != eos)
    second = first.most_common(1)[0][0]
    stops = [eos, second]
    sampled = sample(stops)
    for row in sampled:
        assert not set(row.token_ids[:-1]) & set(stops)
        assert row.finished == (row.token_ids[-1] in stops)
        assert row.finished or len(row.token_ids) == 6
    assert second in {row.token_ids[-1] for row in sampled if row.finished}
    with pytest.raises(ValueError, match="stop token"):
        sample([])
