"""The GRPO trainer in a Ray actor (``trainer.placement: ray``).

The actor holds a :class:`~rollvault.training.grpo_trainer.GrpoTrainer`
built from ``model.path`` and the version-0 weights the driver hands it (its
warm-up, or the saved version-0 policy); :class:`RayTrainer` is the
controller's side, with the trainer's methods. The controller stays the one
owner of the ledger and of snapshots: it sends each step's batch, and the
paths of the checkpoint directories it creates and publishes; the actor
reads and writes only inside those (they must be on storage the actor's node
sees). A trainer actor that dies is not restarted: its optimizer state is
gone, so every later call raises :class:`TrainerLostError`, which ends the
run (``rollvault run`` exits 4, naming the cause); the next start resumes
from the snapshots and the newest trainer checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import ray
import torch
from ray.exceptions import RayActorError
from safetensors.torch import load as load_safetensors
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rollvault.config.schema import ModelDType
from rollvault.controller.loop.trainer import TrainBatch, TrainerLostError
from rollvault.training.grpo_trainer import GrpoSettings, GrpoTrainer
from rollvault.training.model_store import load_model_dir

__all__ = ["RayTrainer", "TrainerActor"]


class TrainerActor:
    """The body of the trainer actor (wrapped with ``ray.remote`` by :class:`RayTrainer`)."""

    def __init__(
        self,
        model_path: str,
        dtype: ModelDType,
        weights: bytes,
        pad_token_id: int,
        settings: bytes,
    ) -> None:
        # One thread, as the local trainer uses beside the generation workers.
        torch.set_num_threads(1)
        model, _ = load_model_dir(Path(model_path), dtype=dtype)
        model.load_state_dict(load_safetensors(weights), strict=True)
        self._trainer = GrpoTrainer(
            model,
            pad_token_id=pad_token_id,
            settings=msgspec.msgpack.decode(settings, type=GrpoSettings),
        )

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return await self._trainer.train_step(batch)

    def weights_for_gate(self) -> bytes:
        return self._trainer.weights_for_gate()

    def export_policy(
        self, path: str, tokenizer: PreTrainedTokenizerBase, with_digests: bool
    ) -> str:
        return str(self._trainer.export_policy(Path(path), tokenizer, with_digests=with_digests))

    def save_checkpoint(self, directory: str) -> None:
        self._trainer.save_checkpoint(Path(directory))

    def load_checkpoint(self, directory: str) -> None:
        self._trainer.load_checkpoint(Path(directory))


class RayTrainer:
    """The controller's handle on the trainer actor: the trainer's own methods."""

    def __init__(
        self,
        trainer: GrpoTrainer,
        *,
        model_path: Path,
        dtype: ModelDType,
        pad_token_id: int,
        settings: GrpoSettings,
        num_cpus: float,
        num_gpus: float,
    ) -> None:
        """Start the actor with ``trainer``'s current weights (the version-0 policy)."""
        actor_class = ray.remote(TrainerActor).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_concurrency=1
        )
        self._actor: Any = actor_class.remote(
            str(model_path),
            dtype,
            trainer.weights_for_gate(),
            pad_token_id,
            msgspec.msgpack.encode(settings),
        )

    @property
    def actor(self) -> Any:
        """The actor handle (a fault test kills it)."""
        return self._actor

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        try:
            metrics: dict[str, float] = await self._actor.train_step.remote(batch)
        except RayActorError as error:
            raise _lost(error) from error
        return metrics

    def weights_for_gate(self) -> bytes:
        weights: bytes = self._get(self._actor.weights_for_gate.remote())
        return weights

    def export_policy(
        self, path: Path, tokenizer: PreTrainedTokenizerBase, *, with_digests: bool = False
    ) -> Path:
        return Path(self._get(self._actor.export_policy.remote(str(path), tokenizer, with_digests)))

    def save_checkpoint(self, directory: Path) -> None:
        self._get(self._actor.save_checkpoint.remote(str(directory)))

    def load_checkpoint(self, directory: Path) -> None:
        self._get(self._actor.load_checkpoint.remote(str(directory)))

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise _lost(error) from error


def _lost(error: RayActorError) -> TrainerLostError:
    return TrainerLostError(
        f"the trainer actor died ({type(error).__name__}); restart the run to resume from "
        "its snapshots and newest trainer checkpoint"
    )
