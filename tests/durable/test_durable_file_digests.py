"""Digests of files and directories: content, not names, and never hidden tool state."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rollvault.durable.file_digests import directory_digests, sha256_file


def test_file_digest_is_sha256_of_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    data = bytes(range(256)) * 9000  # more than one read chunk
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_directory_digests_follow_content_and_skip_hidden_names(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.safetensors").write_bytes(b"abc")
    (model / ".lock").write_text("tool state")
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("cache")
    digests = directory_digests(model)
    assert digests == {
        "config.json": hashlib.sha256(b"{}").hexdigest(),
        "sub/weights.safetensors": hashlib.sha256(b"abc").hexdigest(),
    }
    moved = tmp_path / "elsewhere"
    model.rename(moved)
    assert directory_digests(moved) == digests
    (moved / "sub" / "weights.safetensors").write_bytes(b"abd")
    assert directory_digests(moved)["sub/weights.safetensors"] != digests["sub/weights.safetensors"]


def test_a_missing_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        directory_digests(tmp_path / "nowhere")
