"""Reward functions: a user's ``score(response_text, sample)``, or a built-in, as a text environment.

``reward.function`` names the function (:mod:`~rollvault.rewards.spec`);
:mod:`~rollvault.rewards.loading` imports and checks it;
:mod:`~rollvault.rewards.builtins` holds ``exact_match``, ``numeric_match``
and ``regex_format``; :mod:`~rollvault.rewards.environment` calls it on each
response as a :class:`~rollvault.tasks.protocols.TextEnvironment`; and
:mod:`~rollvault.rewards.identity` digests its source for the run's
fingerprint. The recipe (:func:`rollvault.recipes.run_parts.text_environment`)
picks it over a task's own scoring whenever ``reward.function`` is set.
"""

from rollvault.rewards.environment import RewardFunctionEnvironment
from rollvault.rewards.identity import RewardFunctionIdentity, reward_function_identity
from rollvault.rewards.loading import LoadedRewardFunction, load_reward_function
from rollvault.rewards.spec import (
    BUILTIN_REWARD_FUNCTIONS,
    RewardFunctionSpec,
    parse_reward_function,
)

__all__ = [
    "BUILTIN_REWARD_FUNCTIONS",
    "LoadedRewardFunction",
    "RewardFunctionEnvironment",
    "RewardFunctionIdentity",
    "RewardFunctionSpec",
    "load_reward_function",
    "parse_reward_function",
    "reward_function_identity",
]
