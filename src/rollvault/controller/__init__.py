"""The controller: the asynchronous loop, the data path and rollout snapshots.

- ``loop``: the shared parts, the rollout pump, the finalizer and its
  advantages, the train pump, replay capacity, the run logs and the pipeline
  that runs both pumps; the ``Gate`` and ``Trainer`` protocols it drives.
- ``data``: the dataloader, the sampler, the replay index, spare prompts and
  batch shortfall.
- ``snapshots``: capture and files of a rollout snapshot, the checkpointer,
  choosing what to resume from, and the restorer.

Import from the module (for example ``rollvault.controller.data.sampler``),
not from these packages.
"""
