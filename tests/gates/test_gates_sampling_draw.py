"""The batch draw picks exactly torch.multinomial's token for every row, from the same stream."""

from __future__ import annotations

import pytest
import torch

from rollvault.gates.sampling import _draw


def test_the_draw_is_multinomial_row_by_row() -> None:
    probs = torch.softmax(torch.randn(64, 17, generator=torch.Generator().manual_seed(0)) * 3, -1)
    probs[5, 3:] = 0.0  # a truncated row (top-k / top-p): zero-probability tokens never come
    probs[5] /= probs[5].sum()
    mine = [torch.Generator().manual_seed(100 + r) for r in range(64)]
    theirs = [torch.Generator().manual_seed(100 + r) for r in range(64)]
    done = [r % 7 == 0 for r in range(64)]
    for _ in range(12):  # the generators stay in step: each row draws what it would alone
        chosen = _draw(probs, mine, done).tolist()
        for row in range(64):
            if done[row]:
                assert chosen[row] == 0
            else:
                expected = int(torch.multinomial(probs[row], 1, generator=theirs[row]))
                assert chosen[row] == expected, row
        assert chosen[5] < 3 or done[5]


def test_bad_probabilities_are_refused_as_multinomial_does() -> None:
    generators = [torch.Generator().manual_seed(0)]
    with pytest.raises(RuntimeError, match="inf"):
        _draw(torch.tensor([[0.5, float("nan")]]), generators, [False])
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        _draw(torch.zeros(1, 3), generators, [False])
