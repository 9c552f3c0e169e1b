"""The finished-run checks that need no run: judged from epoch accounts alone."""

from __future__ import annotations

from rollvault.checkpoint_tools.chaos.checks import nothing_trained_problems
from rollvault.checkpoint_tools.run_history import EpochAccount


def _account(epoch: int, *, trained: int, dropped: int, pending: int = 0) -> EpochAccount:
    expected = trained + dropped + pending
    return EpochAccount(
        epoch=epoch, expected=expected, trained=trained, dropped=dropped, pending=pending
    )


def test_a_run_that_dropped_every_prompt_is_a_problem_that_says_so() -> None:
    epochs = [_account(0, trained=0, dropped=6), _account(1, trained=0, dropped=1, pending=1)]
    assert nothing_trained_problems(epochs) == [
        "no prompt was trained: of 8 expected, 7 were dropped and 1 left pending"
    ]


def test_one_trained_prompt_or_no_expected_prompt_is_no_problem() -> None:
    assert nothing_trained_problems([_account(0, trained=1, dropped=7)]) == []
    assert nothing_trained_problems([]) == []
