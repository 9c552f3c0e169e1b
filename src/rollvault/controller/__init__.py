"""The controller: run config, dataset, sampler, replay index, finalizer, pumps, checkpointer.

Each part is a small state object in its own module; import from the module
(for example ``rollvault.controller.sampler``), not from this package.
"""
