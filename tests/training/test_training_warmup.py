"""The supervised warm-up: deterministic given the seed, and it learns the task's format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from grpo_test_helpers import build_model, prompt_ids
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.gates.prompt_rendering import PromptFormat, PromptRenderer
from rollvault.gates.sampling import sample_batch
from rollvault.tasks.addition.dataset import AdditionPromptDataset
from rollvault.tasks.warmup import warmup_examples
from rollvault.training.tokenizer import build_char_tokenizer
from rollvault.training.warmup import WarmupProgress, _encode, supervised_warmup


def _warm(directory: Path, *, seed: int, steps: int) -> tuple[PreTrainedModel, float, float]:
    model, tokenizer = build_model(directory)
    report = supervised_warmup(
        model,
        tokenizer,
        warmup_examples(AdditionPromptDataset(500, seed=0)),
        steps=steps,
        batch_size=32,
        learning_rate=1e-3,
        seed=seed,
    )
    return model, report.first_loss, report.final_loss


def test_warmup_is_deterministic_given_the_seed(tmp_path: Path) -> None:
    first, *_ = _warm(tmp_path / "model", seed=4, steps=6)
    second, *_ = _warm(tmp_path / "model", seed=4, steps=6)
    other, *_ = _warm(tmp_path / "model", seed=5, steps=6)
    pairs = list(zip(first.state_dict().items(), second.state_dict().items(), strict=True))
    assert all(torch.equal(a, b) for (_, a), (_, b) in pairs)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), other.state_dict().values(), strict=True)
    )


def test_warmup_reports_its_start_and_every_step(tmp_path: Path) -> None:
    model, tokenizer = build_model(tmp_path / "model")
    seen: list[WarmupProgress] = []
    report = supervised_warmup(
        model,
        tokenizer,
        warmup_examples(AdditionPromptDataset(50, seed=0)),
        steps=3,
        batch_size=4,
        learning_rate=1e-3,
        seed=0,
        on_progress=seen.append,
    )
    # Once before the first step (no loss yet), then after each step with its loss.
    assert [(p.steps_done, p.steps) for p in seen] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert seen[0].loss is None
    assert seen[1].loss == report.first_loss and seen[-1].loss == report.final_loss
    seconds = [p.seconds for p in seen]
    assert seconds == sorted(seconds) and seconds[-1] <= report.seconds


def _well_formed(model: PreTrainedModel, directory: Path) -> int:
    _, tokenizer = build_model(directory)
    prompts = [prompt_ids(tokenizer, f"{a:02d}+{(3 * a) % 100:02d}=") for a in range(32)]
    sampled = sample_batch(
        model,
        prompts,
        seeds=range(32),
        max_new_tokens=6,
        temperature=1.0,
        stop_token_ids=[int(tokenizer.eos_token_id)],
        pad_token_id=int(tokenizer.pad_token_id),
    )
    return sum(s.finished and _decode(tokenizer, s.token_ids[:-1]).isdigit() for s in sampled)


def _decode(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    text = tokenizer.decode(token_ids)
    # decode is typed for batches too; one sequence decodes to one string.
    assert isinstance(text, str), type(text)
    return text


def test_warmup_teaches_digits_then_eos(tmp_path: Path) -> None:
    untrained, _ = build_model(tmp_path / "model")
    model, first_loss, final_loss = _warm(tmp_path / "model", seed=0, steps=60)
    assert final_loss < 0.6 * first_loss
    # Of 32 sampled answers, an untrained model almost never gives "digits then eos".
    before, after = (
        _well_formed(untrained, tmp_path / "model"),
        _well_formed(model, tmp_path / "model"),
    )
    assert before <= 4 and after >= 16, (before, after)


def test_warmup_examples_are_rendered_as_the_gate_renders_prompts() -> None:
    tokenizer = build_char_tokenizer("0123456789+= \nabcdefghijklmnopqrstuvwxyz")
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
        "+ '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat = PromptRenderer(
        tokenizer, PromptFormat(chat_template=True, system_prompt="add"), model_path=Path("m")
    )
    ids, mask = _encode(tokenizer, chat, 0, "1+2=", "3")
    prompt = chat.prompt_ids({"prompt_text": "1+2="})
    assert ids == [*prompt, *prompt_ids(tokenizer, "3"), end]
    assert mask == [0.0] * len(prompt) + [1.0, 1.0]
    # Without the chat template: the text as it is, then eos, exactly as before.
    plain = PromptRenderer(tokenizer, PromptFormat(), model_path=Path("m"))
    eos = int(tokenizer.eos_token_id)
    expected = [*prompt_ids(tokenizer, "1+2=3"), eos]
    assert _encode(tokenizer, plain, 0, "1+2=", "3")[0] == expected
    assert _encode(tokenizer, None, 0, "1+2=", "3")[0] == expected
    with pytest.raises(ValueError, match="example 7"):
        _encode(tokenizer, chat, 7, "", "3")
