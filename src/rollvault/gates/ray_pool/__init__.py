"""The Ray actor pool gate (``gate.kind: ray``): generation actors, routing, weight broadcast,
actor health. Importing it imports ``ray`` (the ``[ray]`` extra)."""

from rollvault.gates.ray_pool.gate import RayPoolGate
from rollvault.gates.ray_pool.health import ActorHealth, HealthTransitionError

__all__ = ["ActorHealth", "HealthTransitionError", "RayPoolGate"]
