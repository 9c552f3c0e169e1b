"""Rollout snapshots: capture and files, the checkpointer, resume, the restorer."""
