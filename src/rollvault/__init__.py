"""rollvault: crash-safe asynchronous RL rollouts for LLM post-training.

The package layout is the architecture, bottom layer first:

- ``durable``: fsync, atomic publication, snapshot directories, manifests,
  the bootstrap anchor (standard library and msgspec only).
- ``cut``: the mutation cut, the barrier that makes snapshots consistent.
- ``ledger``: the recovery ledger (records, state machine, versioned sidecar).
- ``dataplane``: where token rows live.
- ``controller``: sampler, replay index, finalizer, pumps, checkpointer.
- ``gates``: what executes an attempt.
- ``training``: policy and GRPO loss.
- ``cli``: the command line.

Each layer imports only layers below it (checked by ``lint-imports``). The
public names of the reference spec live in :mod:`rollvault.rollout_recovery`,
:mod:`rollvault.rollout_checkpointing.manifest` and
:mod:`rollvault.rollout_checkpointing.restore`.
"""

__version__ = "0.1.0"
