"""The mutation cut: the barrier that makes a rollout snapshot consistent."""

from rollvault.cut.mutation_cut import (
    CheckpointInsideMutationError,
    DataPlaneMutationCut,
    MutationCutNotHeldError,
)

__all__ = ["CheckpointInsideMutationError", "DataPlaneMutationCut", "MutationCutNotHeldError"]
