"""The Ray pool's pure parts, without Ray: the health state machine and the router."""

from __future__ import annotations

import pytest

from rollvault.gates.ray_pool.health import ActorHealth, HealthTransitionError, check_transition
from rollvault.gates.ray_pool.routing import StickyRouter


def test_an_actor_takes_work_only_after_starting_and_loading_the_weights() -> None:
    path = [ActorHealth.RESTARTING, ActorHealth.STALE, ActorHealth.HEALTHY, ActorHealth.DEAD,
            ActorHealth.RESTARTING, ActorHealth.STALE, ActorHealth.HEALTHY, ActorHealth.SUSPECT,
            ActorHealth.HEALTHY]  # fmt: skip
    for current, new in zip(path, path[1:], strict=False):
        assert check_transition("a", current, new) is new


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (ActorHealth.RESTARTING, ActorHealth.HEALTHY),  # never without the current weights
        (ActorHealth.DEAD, ActorHealth.HEALTHY),
        (ActorHealth.DEAD, ActorHealth.STALE),
        (ActorHealth.STALE, ActorHealth.SUSPECT),
    ],
)
def test_a_forbidden_transition_names_the_actor_and_what_is_allowed(
    current: ActorHealth, new: ActorHealth
) -> None:
    with pytest.raises(HealthTransitionError, match=f"actor-3: cannot go from {current.value}"):
        check_transition("actor-3", current, new)


def test_routing_is_sticky_per_group_and_least_loaded_for_new_groups() -> None:
    router = StickyRouter()
    assert router.route("g1", [0, 0]) == 0  # ties: the lowest index
    assert router.route("g2", [3, 1]) == 1
    assert router.route("g1", [9, 0]) == 0  # sticky while its actor is healthy
    assert router.route("g1", [None, 5]) == 1  # its actor is not healthy: moves
    assert router.route("g1", [0, 5]) == 1  # and stays on the new one
    assert router.route("g3", [None, None]) is None  # nobody healthy
