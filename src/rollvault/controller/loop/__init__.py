"""The asynchronous loop: parts, rollout pump, finalizer, train pump, pipeline."""
