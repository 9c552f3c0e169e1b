"""Spec-facing modules for rollout snapshots.

Deliberately empty: ``manifest`` belongs to the durable layer and ``restore``
to the controller layer, so importing one must not import the other.
"""
