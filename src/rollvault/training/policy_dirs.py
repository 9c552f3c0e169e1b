"""The policy as a Hugging Face model directory: the final model and the version-0 policy.

``save_pretrained`` writes the model's config and safetensors weights and the
tokenizer's files, so ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` (and so an inference server) load the
directory as they load any model. It is published whole through
:func:`rollvault.durable.published_dirs.publish_directory`: a crash while
saving never leaves a partial model under the final name, and a later save
replaces the directory the same way.

A policy a run reloads (the version-0 policy) is saved with
``file_digests.json``; :func:`load_policy` checks every file against it with
:func:`rollvault.durable.trainer_checkpoints.verify_trainer_checkpoint` and
refuses a damaged directory, naming each file that does not match.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelDType
from rollvault.durable.published_dirs import publish_directory
from rollvault.durable.trainer_checkpoints import verify_trainer_checkpoint
from rollvault.gates.causal_lm import ModelDirError, quiet_transformers
from rollvault.training.model_store import load_model_dir

__all__ = ["DamagedPolicyError", "load_policy", "publish_policy"]


class DamagedPolicyError(ModelDirError):
    """A saved policy's files do not match the digests recorded when it was saved."""


def publish_policy(
    path: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    with_digests: bool = False,
) -> Path:
    """Save ``model`` and ``tokenizer`` as a model directory at ``path``, replacing it whole.

    With ``with_digests``, ``file_digests.json`` records every file, so that
    :func:`load_policy` can check them. Raises ``SnapshotWriteError`` when
    writing fails (an earlier directory at ``path`` is then untouched).
    """
    quiet_transformers()

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return publish_directory(path, write, with_digests=with_digests)


def load_policy(
    path: Path, *, dtype: ModelDType = ModelDType.FLOAT32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in ``dtype``) and tokenizer saved at ``path`` with digests, once every
    file checks out.

    Raises :class:`DamagedPolicyError` naming each missing, changed or
    unlisted file (or a missing ``file_digests.json``).
    """
    problems = verify_trainer_checkpoint(path)
    if problems:
        listing = "; ".join(f"{file}: {problem}" for file, problem in problems)
        raise DamagedPolicyError(f"refusing to load the policy in {path}: {listing}")
    return load_model_dir(path, dtype=dtype)
