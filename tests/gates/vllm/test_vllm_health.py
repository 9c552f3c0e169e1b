"""The fleet-health state machine: only the listed transitions, checked errors, and work only
for healthy servers (hypothesis drives random event sequences against a model of the rules)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollvault.gates.vllm.health import (
    TRANSITIONS,
    FleetHealth,
    HealthEvent,
    ServerHealth,
    ServerStateError,
)

H, E = ServerHealth, HealthEvent


def test_the_life_of_a_server_that_dies_and_comes_back() -> None:
    fleet = FleetHealth(["http://a"], initial=H.HEALTHY)
    path = [E.FAILED, E.FAILED, E.RESTARTING, E.UP, E.NEW_VERSION, E.REFITTED]
    states = [fleet.move("http://a", event) for event in path]
    assert states == [H.SUSPECT, H.DEAD, H.RESTARTING, H.STALE, H.STALE, H.HEALTHY]
    assert [(before, after) for _, before, _, after in fleet.history] == [
        (H.HEALTHY, H.SUSPECT),
        (H.SUSPECT, H.DEAD),
        (H.DEAD, H.RESTARTING),
        (H.RESTARTING, H.STALE),
        (H.STALE, H.HEALTHY),
    ]


def test_a_move_the_table_forbids_names_the_server_and_its_state() -> None:
    fleet = FleetHealth(["http://a", "http://b"], initial=H.DEAD)
    with pytest.raises(ServerStateError, match=r"http://b is dead: it cannot take event refitted"):
        fleet.move("http://b", E.REFITTED)
    assert fleet.state("http://b") is H.DEAD  # unchanged
    with pytest.raises(KeyError, match="no inference server http://c"):
        fleet.state("http://c")


def test_a_stale_server_needs_a_refit_not_a_health_check() -> None:
    # /health answering says nothing about which weights a restarted server holds.
    fleet = FleetHealth(["http://a"], initial=H.STALE)
    with pytest.raises(ServerStateError):
        fleet.move("http://a", E.CHECKED_OK)


def test_a_new_version_leaves_no_server_healthy() -> None:
    for state in ServerHealth:
        after = TRANSITIONS[(state, E.NEW_VERSION)]
        assert after is not H.HEALTHY, state


class FleetMachine(RuleBasedStateMachine):
    """Random events on a fleet of three; the model is the table itself plus its rules."""

    SERVERS = ("http://a", "http://b", "http://c")

    def __init__(self) -> None:
        super().__init__()
        self.fleet = FleetHealth(self.SERVERS, initial=H.DEAD)
        self.model = dict.fromkeys(self.SERVERS, H.DEAD)
        self.current_version = 0
        self.loaded = dict.fromkeys(self.SERVERS, -1)
        """The version each server holds, as far as the events say."""

    @rule(server=st.sampled_from(SERVERS), event=st.sampled_from(list(HealthEvent)))
    def event(self, server: str, event: HealthEvent) -> None:
        expected = TRANSITIONS.get((self.model[server], event))
        if expected is None:
            with pytest.raises(ServerStateError):
                self.fleet.move(server, event)
            return
        assert self.fleet.move(server, event) is expected
        self.model[server] = expected
        if event is E.UP:
            self.loaded[server] = -1  # a restarted server holds its start-up weights
        if event is E.REFITTED:
            self.loaded[server] = self.current_version

    @rule()
    def new_version(self) -> None:
        self.current_version += 1
        for server in self.SERVERS:
            expected = TRANSITIONS[(self.model[server], E.NEW_VERSION)]
            assert self.fleet.move(server, E.NEW_VERSION) is expected
            self.model[server] = expected

    @invariant()
    def states_match_the_model(self) -> None:
        assert self.fleet.snapshot() == self.model

    @invariant()
    def a_healthy_server_holds_the_current_version(self) -> None:
        for server in self.fleet.in_state(H.HEALTHY):
            assert self.loaded[server] == self.current_version, server


FleetMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
TestFleetHealth = FleetMachine.TestCase
