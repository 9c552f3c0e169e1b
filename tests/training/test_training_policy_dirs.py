"""The policy saved as a Hugging Face model directory, loaded back by from_pretrained."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from grpo_test_helpers import build_model, sampled_batch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.durable.trainer_checkpoints import TRAINER_DIGESTS_FILENAME
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.policy_dirs import DamagedPolicyError, load_policy


def _assert_same_weights(model: PreTrainedModel, expected: dict[str, torch.Tensor]) -> None:
    loaded = model.state_dict()
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def _trained(tmp_path: Path) -> tuple[GrpoTrainer, PreTrainedModel, PreTrainedTokenizerBase]:
    model, tokenizer = build_model(tmp_path / "model")
    trainer = GrpoTrainer(
        model, pad_token_id=int(tokenizer.pad_token_id), settings=GrpoSettings(learning_rate=1e-2)
    )
    batch = sampled_batch(model, tokenizer, step=0, prompts=["12+30=", "07+35="], generations=4)
    asyncio.run(trainer.train_step(batch))
    return trainer, model, tokenizer


def test_an_exported_policy_loads_through_from_pretrained(tmp_path: Path) -> None:
    trainer, model, tokenizer = _trained(tmp_path)
    start = build_model(tmp_path / "model")[0].state_dict()
    expected = {name: t.detach().clone() for name, t in model.state_dict().items()}
    assert any(not torch.equal(expected[name], t) for name, t in start.items()), "no step taken"
    path = trainer.export_policy(tmp_path / "ckpt" / "final_model", tokenizer)
    assert path == tmp_path / "ckpt" / "final_model"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in path.iterdir()
    }
    assert not (path / TRAINER_DIGESTS_FILENAME).exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["final_model"]
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    _assert_same_weights(loaded, expected)
    again = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert again("07+35=42").input_ids == tokenizer("07+35=42").input_ids
    assert (again.pad_token_id, again.eos_token_id) == (0, 1)


def test_a_later_export_replaces_the_directory_whole(tmp_path: Path) -> None:
    trainer, model, tokenizer = _trained(tmp_path)
    path = tmp_path / "final_model"
    trainer.export_policy(path, tokenizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    trainer.export_policy(path, tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    _assert_same_weights(loaded, model.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model", "model"]


def test_a_policy_saved_with_digests_loads_checked_and_a_damaged_one_is_refused(
    tmp_path: Path,
) -> None:
    trainer, model, tokenizer = _trained(tmp_path)
    path = trainer.export_policy(tmp_path / "policy", tokenizer, with_digests=True)
    loaded, loaded_tokenizer = load_policy(path)
    _assert_same_weights(loaded, model.state_dict())
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight: the file still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedPolicyError) as info:
        load_policy(path)
    assert str(info.value) == (
        f"refusing to load the policy in {path}: {weights}: content changed (digest mismatch)"
    )
    (path / TRAINER_DIGESTS_FILENAME).unlink()
    with pytest.raises(DamagedPolicyError, match=f"{TRAINER_DIGESTS_FILENAME}: missing"):
        load_policy(path)
