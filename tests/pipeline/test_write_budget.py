"""The write budget both segment writers spend their optional rewrites from."""

from __future__ import annotations

from rollvault.controller.snapshots.write_budget import (
    ESTIMATE_SLACK,
    carry_after,
    headroom,
    take_within,
    write_budget,
)


def test_candidates_are_taken_in_order_until_the_first_that_does_not_fit() -> None:
    # "c" would fit after "b" is refused, but it waits its turn: the order is the priority.
    assert take_within(10, [(4, "a"), (7, "b"), (1, "c")]) == (["a"], 4)
    assert take_within(11, [(4, "a"), (7, "b"), (1, "c")]) == (["a", "b"], 11)
    assert take_within(0, [(0, "free"), (1, "a")]) == (["free"], 0)
    assert take_within(5, []) == ([], 0)


def test_a_lazy_cost_past_the_first_refusal_is_never_computed() -> None:
    computed: list[str] = []

    def cost(item: str, size: int) -> tuple[int, str]:
        computed.append(item)
        return size, item

    taken, spent = take_within(
        5, (cost(item, size) for item, size in [("a", 3), ("b", 3), ("c", 1)])
    )
    assert (taken, spent, computed) == (["a"], 3, ["a", "b"])


def test_the_budget_is_a_share_of_the_changes_plus_the_carry() -> None:
    assert write_budget(1.0, 1_000, 0) == 1_000
    assert write_budget(0.5, 1_001, 30) == 530


def test_unspent_bytes_are_carried_only_while_a_rewrite_waits() -> None:
    assert carry_after(1_000, 400, waiting=True) == 600
    assert carry_after(1_000, 400, waiting=False) == 0


def test_the_headroom_is_what_1_1x_the_new_rows_leaves_after_the_rest() -> None:
    # 1.1x of 400 KB leaves 40 KB beside the rows: 18 KB written, 12 KB estimated, the slack.
    assert headroom(400_000, 18_000, 12_000) == 40_000 - 30_000 - ESTIMATE_SLACK
    assert headroom(400_000, 30_000, 12_000) == 0  # over already: never negative
    assert headroom(400_000, 0, None) == 0  # no estimate yet: no room by choice


def test_the_room_caps_the_budget_and_the_carry_it_leaves() -> None:
    assert write_budget(1.0, 5_000, 2_000, room=3_000) == 3_000
    assert write_budget(1.0, 5_000, 2_000, room=-10) == 0  # its own writes took the room
    assert write_budget(1.0, 5_000, 2_000, room=None) == 7_000
    # The carry is what the capped budget leaves: it never grows past one snapshot's share.
    assert carry_after(write_budget(1.0, 5_000, 2_000, room=3_000), 0, waiting=True) == 3_000
