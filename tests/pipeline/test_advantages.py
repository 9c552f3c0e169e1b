import numpy as np
import pytest

from rollvault.controller.loop.advantages import group_advantages


def test_centred_on_the_group_mean_without_std() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, normalize_by_std=False, epsilon=1e-6)
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5])


def test_divided_by_std_plus_epsilon() -> None:
    rewards = [3.0, 1.0, 2.0]
    adv = group_advantages(rewards, [True] * 3, normalize_by_std=True, epsilon=0.5)
    expected = (np.array(rewards) - 2.0) / (np.std(rewards) + 0.5)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_masked_sibling_gets_zero_and_does_not_move_the_baseline() -> None:
    adv = group_advantages(
        [1.0, 100.0, 0.0], [True, False, True], normalize_by_std=False, epsilon=1e-6
    )
    np.testing.assert_allclose(adv, [0.5, 0.0, -0.5])


def test_equal_rewards_give_zero_advantage() -> None:
    adv = group_advantages([0.7] * 4, [True] * 4, normalize_by_std=True, epsilon=1e-6)
    np.testing.assert_allclose(adv, np.zeros(4), atol=1e-6)


def test_all_masked_group_is_all_zero() -> None:
    adv = group_advantages([1.0, 2.0], [False, False], normalize_by_std=True, epsilon=1e-6)
    assert adv.tolist() == [0.0, 0.0]


def test_length_mismatch_is_named() -> None:
    with pytest.raises(ValueError, match="2 rewards but 3 validity flags"):
        group_advantages([1.0, 2.0], [True] * 3, normalize_by_std=True, epsilon=1e-6)
